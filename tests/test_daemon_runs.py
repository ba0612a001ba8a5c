"""One daemon, several runs: two replayed runs watched by one `streamer run`, each with its own
output folder and ledger, each giving the rows of `streamer call` on its reads."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time

import numpy as np

from conftest import ECOLI, REFERENCE
from daemon_support import rows
from test_daemon_e2e import TIMEOUT, daemons, expected, fixture_copy, replay, summary  # noqa: F401

from streamer import config
from streamer.config import load
from streamer.daemon.basecall_cache import read_basecall_file
from streamer.daemon.batches import DaemonBatch, picked, signal_wanted
from streamer.daemon.ledger import Pick
from streamer.daemon.runs import check_publishing, made_once, run_config, run_folders
from streamer.daemon.replay import Replayer, ReplayOptions, load_source
from streamer.io.alignments import AlignmentFilter
from streamer.io.reference import Reference
from streamer.io.signal import signal_read_ids
from streamer.pipeline.batch import pack
from streamer.pipeline.signal_pool import SignalReads


def test_two_given_run_folders_give_each_the_rows_of_streamer_call(fixture_copy, expected, daemons,  # noqa: F811
                                                                   tmp_path):
    parent, out = tmp_path / "data", tmp_path / "out"
    first, second = parent / "flowcell_a", parent / "flowcell_b"
    first.mkdir(parents=True)
    second.mkdir()
    d = daemons(tmp_path, first, out, "--watch-also", str(second))
    reps = [replay(fixture_copy, folder, "--interval", "0.3", "--batch-size", "3") for folder in (first, second)]
    assert [r.wait(TIMEOUT) for r in reps] == [0, 0]
    assert d.wait(2 * TIMEOUT) == 0, d.output()
    for name in ("flowcell_a", "flowcell_b"):
        assert rows(out / name / "meth.tsv") == expected
        s = summary(out / name)
        assert s["state"] == "finished" and s["reads"]["called"] == 8
        assert (out / name / ".streamer").is_dir()  # a ledger of its own
    assert not (out / "meth.tsv").exists()


def test_run_folders_appearing_in_a_parent_are_each_a_run(fixture_copy, expected, daemons, tmp_path):  # noqa: F811
    parent, out = tmp_path / "data", tmp_path / "out"
    parent.mkdir()
    d = daemons(tmp_path, parent, out, "--each-run")
    assert d.ready.wait(TIMEOUT), d.output()
    reps = []
    for name in ("flowcell_a", "flowcell_b"):  # MinKNOW makes a flow cell's folder when its run starts
        (parent / name).mkdir()
        reps.append(replay(fixture_copy, parent / name, "--interval", "0.3", "--batch-size", "3"))
        time.sleep(0.5)
    assert [r.wait(TIMEOUT) for r in reps] == [0, 0]
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and not all(
            (out / n / "summary.json").exists() and summary(out / n)["state"] == "finished"
            for n in ("flowcell_a", "flowcell_b")):  # fmt: skip
        time.sleep(0.2)
    (parent / "STOP").touch()  # the box's daemon watches until told
    assert d.wait() == 0, d.output()
    for name in ("flowcell_a", "flowcell_b"):
        assert rows(out / name / "meth.tsv") == expected


def test_each_run_gets_its_own_output_and_state_folders(tmp_path):
    parent = tmp_path / "data"
    for name in ("run_b", "run_a", ".hidden"):
        (parent / name).mkdir(parents=True)
    (parent / "out").mkdir()
    genome = tmp_path / "g.fa"
    genome.write_text(">c\nACGT\n")
    cfg = load(None, {"watch.dir": parent, "watch.each_run": True, "reference.genome": genome,
                      "output.dir": parent / "out", "output.state_dir": tmp_path / "state"})  # fmt: skip
    assert run_folders(cfg) == [parent / "run_a", parent / "run_b"]
    one = run_config(cfg, parent / "run_a")
    assert (one.watch.dir, one.output.dir, one.state_dir()) == (parent / "run_a", parent / "out" / "run_a",
                                                                 tmp_path / "state" / "run_a")  # fmt: skip
    assert not one.watch.each_run and one.watch.also == ()


def test_the_runs_share_one_aligner_made_by_the_first_that_needs_it():
    made = []
    get = made_once(lambda: made.append(object()) or made[-1])
    threads = [threading.Thread(target=get) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and get() is made[0]


def test_a_daemon_batch_is_packed_from_the_readers_columns_as_from_its_records(tmp_path):
    """The daemon packs a batch straight from its signal readers' columns (`assemble_batch`), and makes the
    records (`ReadInput`s) only for a retry read by read: packing those gives the same batch, array for array."""
    bam = ECOLI / "reads.bam"
    found = read_basecall_file(bam, "bam", AlignmentFilter())
    where = {rid: path for path in sorted((ECOLI / "fast5").glob("*.fast5")) for rid in signal_read_ids(path)}
    picks = [Pick(rid, bc.n_bases, where[rid], bam, "bam", 0.0, i) for i, (rid, bc) in enumerate(found.items())]
    genome = tmp_path / "ref.fa"
    genome.write_bytes(gzip.decompress(REFERENCE.read_bytes()))
    with Reference(genome) as ref:
        job = DaemonBatch(picks, *picked(picks, found, {}), SignalReads(None).take(signal_wanted(picks, found)), ref)
        a = job.assemble()
        assert a.batch is not None and a.reads == [] and a.remake is not None
        again = pack(a.records())
    assert job.input_ids == a.batch.read_ids == [r.read_id for r in a.records()] and len(a.batch.read_ids) >= 8
    for name, value in vars(a.batch).items():
        if isinstance(value, np.ndarray):
            assert value.dtype == getattr(again, name).dtype and np.array_equal(value, getattr(again, name)), name
    assert (a.batch.ref_names, a.batch.signal_paths) == (again.ref_names, again.signal_paths)


def spans_of(batch) -> list[tuple[bytes, int]]:
    """Each record's reference bases and the base after them, as the batch was packed."""
    return [(batch.ref_seq[batch.ref_seq_off[i] : batch.ref_seq_off[i + 1]].tobytes(), int(batch.ref_next[i]))
            for i in range(batch.n)]


def test_runs_assembling_batches_at_once_give_each_record_its_own_reference_span(tmp_path):
    """The runs share one `Reference` and assemble their batches on their own threads, at the same time
    when their flow cells land files together. Each record must get its own span of an indexed FASTA:
    htslib's one handle, read from several threads, gave reads another place's bases (rows changed,
    added or lost in a 4-cell replay)."""
    genome = tmp_path / "ref.fa"
    genome.write_bytes(gzip.decompress(REFERENCE.read_bytes()))  # plain FASTA: read through its index
    bam = ECOLI / "reads.bam"
    found = read_basecall_file(bam, "bam", AlignmentFilter())
    where = {rid: path for path in sorted((ECOLI / "fast5").glob("*.fast5")) for rid in signal_read_ids(path)}
    picks = [Pick(rid, bc.n_bases, where[rid], bam, "bam", 0.0, i) for i, (rid, bc) in enumerate(found.items())]
    with Reference(genome) as ref:
        runs = [DaemonBatch(picks, *picked(picks, found, {}), SignalReads(None).take(signal_wanted(picks, found)),
                            ref) for _ in range(4)]  # fmt: skip
        alone = spans_of(runs[0].assemble().batch)
        wrong: list[object] = []

        def assemble(batch: DaemonBatch) -> None:
            for _ in range(2000):
                try:
                    spans = spans_of(batch.assemble().batch)
                except Exception as exc:  # noqa: BLE001 - a read of the shared handle that failed outright
                    spans = exc
                if spans != alone:
                    wrong.append(spans)

        threads = [threading.Thread(target=assemble, args=(b,)) for b in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(alone) >= len(picks) == 8 and all(seq for seq, _ in alone)
    assert not wrong, f"{len(wrong)} of {2000 * len(runs)} batches assembled with other spans"


def test_several_runs_publish_with_one_address_each_or_are_refused_with_one_line(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for r in runs:
        r.mkdir()
    proc = subprocess.run([sys.executable, "-m", "streamer", "run", "--watch", runs[0], "--watch-also", runs[1],
                           "-g", REFERENCE, "-o", tmp_path / "out", "--publish", "tcp://127.0.0.1:5599"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 78, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "streamer run: configuration error: publish.endpoint tcp://127.0.0.1:5599: with several runs each run "
        "publishes its own stream")
    assert "Traceback" not in proc.stderr
    cfg = config.build({"watch.dir": runs[0], "watch.also": [str(runs[1])], "reference.genome": REFERENCE,
                        "output.dir": tmp_path / "out", "publish.endpoint": f"ipc://{tmp_path}/{{run}}.sock",
                        "publish.snapshot_endpoint": "tcp://127.0.0.1:*"})
    check_publishing(cfg)
    b = run_config(cfg, runs[1]).publish
    assert b.endpoint == f"ipc://{tmp_path}/b.sock" and b.snapshot_endpoint == "tcp://127.0.0.1:*"


def test_each_run_has_its_own_stream_with_its_calls(fixture_copy, expected, daemons, tmp_path):  # noqa: F811
    """Two runs in one daemon, each published on its own socket: each subscriber gets its run's calls."""
    from streamer.publish.client import Calls, Subscriber
    from streams import tsv_rows

    runs = [tmp_path / "flowcell_a", tmp_path / "flowcell_b"]
    for r in runs:
        r.mkdir()
        Replayer(load_source(fixture_copy), r, ReplayOptions(speed=0, batch_reads=3)).run()
    out = tmp_path / "out"
    endpoint = f"ipc://{tmp_path}/{{run}}.sock"
    d = daemons(tmp_path, runs[0], out, "--watch-also", runs[1], "--publish", endpoint, "--snapshot",
                f"ipc://{tmp_path}/{{run}}-snap.sock", "--follow")
    got: dict[str, list] = {}
    threads = []
    for r in runs:
        def follow(name=r.name):
            with Subscriber(endpoint.replace("{run}", name), ["meth.call"]) as sub:
                for msg in sub:
                    if isinstance(msg, Calls):
                        got.setdefault(name, []).extend(tsv_rows(msg.calls))
        threads.append(threading.Thread(target=follow, daemon=True))
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while not all((out / r.name / "summary.json").exists() and
                  json.loads((out / r.name / "summary.json").read_text())["reads"]["done"] == 8 for r in runs):
        assert time.monotonic() < deadline and d.proc.poll() is None, d.output()
        time.sleep(0.2)
    d.proc.terminate()
    assert d.wait() == 0, d.output()
    for t in threads:
        t.join(10)
    for r in runs:
        assert sorted(got[r.name]) == sorted(expected), r.name
        s = json.loads((out / r.name / "summary.json").read_text())
        assert s["publish"]["endpoints"] == [endpoint.replace("{run}", r.name)]
