"""The daemon's optional outputs against the offline commands on the same reads: eventalign.tsv
and its topic (`streamer eventalign`), meth.bed (`streamer call --bedmethyl`) and the per-BAM
modBAM copies (`streamer call --modbam`), in-process and through kill -9 and restart."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pysam
import pytest

from conftest import ECOLI, REFERENCE
from daemon_support import FakePipeline, no_leaks, rows  # noqa: F401
from streamer import config
from streamer.daemon.aligner import ReadAligner
from streamer.daemon.shell import Daemon, State
from streamer.io.alignments import AlignmentFilter
from streamer.io.reference import Reference
from streamer.daemon.ledger import LedgerError
from streamer.pipeline.stages import Pipeline, PipelineOptions
from streamer_plugins.cpg.caller import CpgCaller
from streamer_plugins.eventalign import EventalignStage
from streamer_plugins.outputs.bedmethyl import BedMethyl
from streamer_plugins.outputs.calls_tsv import read_calls_file
from streamer_plugins.outputs.modbam import probability_code
from streamer.publish.client import EventAlign
from streamer.publish.messages import decode_message
from streamer.publish.protocol import encode_columns, pack, stamp
from streamer.daemon.replay import Replayer, ReplayOptions, load_source

TIMEOUT = 90


def streamer(*args) -> list[str]:
    return [sys.executable, "-m", "streamer", *map(str, args)]


def offline(*args) -> None:
    subprocess.run(streamer(*args, "-r", ECOLI / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE,
                            "--signal", ECOLI / "fast5"), check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def call_outputs(tmp_path_factory) -> Path:
    """`streamer call` with --bedmethyl and --modbam on the fixture's reads."""
    d = tmp_path_factory.mktemp("call")
    offline("call", "-o", d / "meth.tsv", "--bedmethyl", d / "meth.bed", "--modbam", d / "mod.bam")
    return d


@pytest.fixture(scope="module")
def eventalign_tsv(tmp_path_factory):
    """`streamer eventalign --print-read-names` with the given further flags, once per flag set."""
    d = tmp_path_factory.mktemp("eventalign")
    made: dict[tuple[str, ...], Path] = {}

    def get(*flags: str) -> Path:
        if flags not in made:
            out = made[flags] = d / f"ea{len(made)}.tsv"
            offline("eventalign", "--print-read-names", *flags, "-o", out)
        return made[flags]

    return get


def data_rows(path: Path) -> list[str]:
    return sorted(Path(path).read_text().splitlines(keepends=True)[1:])


def with_read_names(tsv: Path, ledger: Path) -> list[str]:
    """eventalign rows whose read_index (the ledger's read number) is replaced by the read's name."""
    with sqlite3.connect(ledger) as db:
        names = {str(i): rid for i, rid in db.execute("SELECT id, read_id FROM reads")}
    out = []
    for line in Path(tsv).read_text().splitlines(keepends=True)[1:]:
        f = line.split("\t")
        f[3] = names[f[3]]
        out.append("\t".join(f))
    return sorted(out)


# ---------------------------------------------------------------------------- modBAM checks


def bam_records(paths) -> list[pysam.AlignedSegment]:
    out = []
    for p in paths:
        with pysam.AlignmentFile(str(p), "rb", check_sq=False) as fh:
            out.extend(fh.fetch(until_eof=True))
    return out


def tags(records) -> dict[tuple, tuple[str | None, list[int]]]:
    """(name, flag, contig, start) -> (MM, ML) of every record; a record twice fails."""
    out = {}
    for rec in records:
        key = (rec.query_name, rec.flag, rec.reference_name, rec.reference_start)
        assert key not in out, f"record {key} written twice"
        out[key] = (rec.get_tag("MM") if rec.has_tag("MM") else None,
                    list(rec.get_tag("ML")) if rec.has_tag("ML") else [])
    return out


def check_modbams(out: Path, live: Path, call_outputs: Path) -> None:
    """One copy per input BAM with exactly its records; tags as `streamer call --modbam`'s (ML within 1),
    every probability within 1/256 of its call's in meth.tsv."""
    inputs = sorted(live.rglob("*.bam"))
    assert inputs
    copies = [out / "modbam" / p.relative_to(live) for p in inputs]
    assert sorted((out / "modbam").rglob("*.bam")) == sorted(copies)
    for src, copy in zip(inputs, copies):
        assert sorted(tags(bam_records([src]))) == sorted(tags(bam_records([copy])))
    got, want = tags(bam_records(copies)), tags(bam_records([call_outputs / "mod.bam"]))
    assert set(got) == set(want)
    for key, (mm, ml) in want.items():
        assert got[key][0] == mm, key
        assert len(got[key][1]) == len(ml) and all(abs(a - b) <= 1 for a, b in zip(got[key][1], ml)), key
    assert sum(len(ml) for _, ml in got.values()) > 100
    llr = {}
    for line in (out / "meth.tsv").read_text().splitlines()[1:]:
        chrom, strand, start, _, read, ratio, *_, seq = line.split("\t")
        first = pos = seq.find("CG")
        while pos != -1:
            llr[read, chrom, strand == "-", int(start) + pos - first + (strand == "-")] = float(ratio)
            pos = seq.find("CG", pos + 1)
    n = 0
    for rec in bam_records(copies):
        ref_of = dict(rec.get_aligned_pairs(matches_only=True))
        for qpos, code in (rec.modified_bases or {}).get(("C", int(rec.is_reverse), "m"), []):  # SEQ positions
            ratio = llr[rec.query_name, rec.reference_name, rec.is_reverse, ref_of[qpos]]
            p = 1 / (1 + math.exp(-ratio))
            assert code == probability_code(ratio) and 0 <= p - code / 256 < 1 / 256
            n += 1
    assert n == sum(len(ml) for _, ml in got.values())


# ---------------------------------------------------------------------------- in-process, with publishing


class RecordingPublisher:
    def __init__(self):
        self.got: list[tuple[str, tuple]] = []

    def __getattr__(self, name):
        return lambda *args: self.got.append((name, args))


@pytest.fixture(scope="module")
def eventalign_pipeline():
    return Pipeline(PipelineOptions(threads=2), [EventalignStage(scale_events=False), CpgCaller()])


def make_config(tmp_path: Path, **keys) -> config.Config:
    flat = {"watch.dir": tmp_path / "live", "reference.genome": REFERENCE, "output.dir": tmp_path / "out",
            "watch.poll_interval": 0.05, "watch.settle": 0.2, "end.final_summary_grace": 0.2,
            "batch.max_wait": 0.1, "service.status_interval": 0.1,
            "pipeline.io_mode": "threads",  # reader processes (the default) are run by test_daemon_e2e
            **keys}
    (tmp_path / "live").mkdir(exist_ok=True)
    return config.build(flat)


def run_daemon(cfg, pipeline, **kw) -> Daemon:
    filt = AlignmentFilter()
    with Reference(REFERENCE) as ref:
        d = Daemon(cfg, pipeline, ref, make_aligner=lambda: ReadAligner(cfg.reference.genome, filt), **kw)
        try:
            assert d.run() == 0
        finally:
            d.close()
    return d


def test_daemon_outputs_equal_the_offline_commands(eventalign_pipeline, eventalign_tsv, call_outputs, tmp_path):
    """eventalign.tsv (read numbers from the ledger), its messages, meth.bed and the modBAM copies."""
    Replayer(load_source(ECOLI), tmp_path / "live", ReplayOptions(speed=0, batch_reads=3)).run()
    cfg = make_config(tmp_path, **{"batch.max_reads": 3, "eventalign.enabled": True,
                                   "eventalign.print_read_names": False, "eventalign.signal_index": True,
                                   "output.modbam": True})
    pub = RecordingPublisher()
    d = run_daemon(cfg, eventalign_pipeline, publisher=pub)
    out = cfg.output.dir
    assert d.state is State.FINISHED
    want = eventalign_tsv("--signal-index")
    ea = out / "eventalign.tsv"
    assert ea.read_text().splitlines()[0] == want.read_text().splitlines()[0].replace("read_name", "read_index")
    got = with_read_names(ea, cfg.state_dir() / "ledger.sqlite")
    assert got == data_rows(want) and len(got) > 10_000
    s = json.loads((out / "summary.json").read_text())
    assert s["eventalign_rows"] == len(got) and s["modbam"] == {"written": 3, "not_written": 0}
    # the topic: through the wire encoding, the messages print as the file's rows
    sent = [a[0] for name, a in pub.got if name == "publish_eventalign"]
    decoded = [decode_message([b"eventalign", stamp("eventalign", "r", i + 1), pack(encode_columns(cols, None))])
               for i, cols in enumerate(sent)]
    assert all(isinstance(m, EventAlign) for m in decoded)
    messages = [m.columns for m in decoded]
    assert messages and all(m["read_index"].dtype == np.int64 and m["event_level_mean"].dtype == np.float32
                            for m in messages)
    fmt = "%s\t%d\t%s\t%d\t%s\t%d\t%.2f\t%.3f\t%.5f\t%s\t%.2f\t%.2f\t%.2f\t%d\t%d\n"
    names = ea.read_text().splitlines()[0].split("\t")
    printed = sorted(fmt % tuple(m[c][j] for c in names) for m in messages for j in range(len(m["contig"])))
    assert printed == sorted(ea.read_text().splitlines(keepends=True)[1:])
    # meth.bed: what `streamer call --bedmethyl` writes, and what bedMethyl makes of meth.tsv
    assert rows(out / "meth.tsv") == rows(call_outputs / "meth.tsv")
    assert (out / "meth.bed").read_text() == (call_outputs / "meth.bed").read_text()
    bed = BedMethyl()
    for block in read_calls_file(out / "meth.tsv"):
        bed.add_calls(block.products["calls"], block.ref_names)
    assert [r[:3] for r in bed.rows()] == [tuple(x.split("\t")[i] if i != 1 else int(x.split("\t")[1])
                                                  for i in (0, 1, 5)) for x in (out / "meth.bed").read_text().splitlines()]
    check_modbams(out, tmp_path / "live", call_outputs)


def test_eventalign_columns_are_fixed_for_the_life_of_the_file(tmp_path, no_leaks):
    """Restarting with other eventalign columns would mix layouts in one file: the start is refused."""
    cfg = make_config(tmp_path, **{"eventalign.enabled": True})
    with Reference(REFERENCE) as ref:
        d = Daemon(cfg, FakePipeline(), ref)
        d.start()
        d.close()
        changed = make_config(tmp_path, **{"eventalign.enabled": True, "eventalign.signal_index": True})
        d = Daemon(changed, FakePipeline(), ref)
        with pytest.raises(LedgerError, match="other columns"):
            d.start()
        d = Daemon(cfg, FakePipeline(), ref)  # as it was: fine again
        d.start()
        d.close()


def test_no_modbam_for_fastq_basecalls(tmp_path, no_leaks):
    """Basecalls from FASTQ carry no alignments to tag: no copy is made, nothing is held for one."""
    Replayer(load_source(ECOLI), tmp_path / "live", ReplayOptions(speed=0, batch_reads=3, bam=False)).run()
    cfg = make_config(tmp_path, **{"output.modbam": True})
    d = run_daemon(cfg, FakePipeline())
    assert d.state is State.FINISHED and not (cfg.output.dir / "modbam").exists()
    s = json.loads((cfg.output.dir / "summary.json").read_text())
    assert s["modbam"] == {"written": 0, "not_written": 0} and not next(s for s in d.sinks if hasattr(s, "copies")).copies.calls.by_record


def test_a_late_read_has_its_bams_copy_made_again_with_every_call(call_outputs, tmp_path, no_leaks):
    """One BAM for all reads, one read's signal landing after the join timeout and after the BAM
    was copied: the copy is made again, with that read's calls and the others' read back."""
    live = tmp_path / "live"
    shutil.copytree(ECOLI / "fast5", live / "fast5")
    held = Path(shutil.move(sorted((live / "fast5").iterdir())[0], tmp_path))
    shutil.copy(ECOLI / "reads.bam", live)
    cfg = make_config(tmp_path, **{"output.modbam": True, "end.follow": True, "join.timeout": 1.0,
                                   "output.refresh_interval": 0.1})
    summary = cfg.output.dir / "summary.json"
    with Reference(REFERENCE) as ref:
        d = Daemon(cfg, Pipeline(PipelineOptions(threads=2), [CpgCaller()]), ref)
        t = threading.Thread(target=d.run)
        t.start()
        try:
            deadline = time.monotonic() + TIMEOUT
            while not (summary.exists() and json.loads(summary.read_text())["modbam"]["written"] == 1):
                assert time.monotonic() < deadline and t.is_alive()
                time.sleep(0.1)
            shutil.move(held, live / "fast5")
            while "recovered" not in (cfg.output.dir / "skipped.tsv").read_text():
                assert time.monotonic() < deadline and t.is_alive()
                time.sleep(0.1)
        finally:
            (live / "STOP").touch()
            t.join(TIMEOUT)
            d.close()
    assert d.state is State.FINISHED
    s = json.loads(summary.read_text())
    assert s["modbam"] == {"written": 1, "not_written": 0} and s["reads"]["recovered"] >= 1
    assert data_rows(cfg.output.dir / "meth.tsv") == data_rows(call_outputs / "meth.tsv")
    check_modbams(cfg.output.dir, live, call_outputs)


# ---------------------------------------------------------------------------- real processes, kill -9


def test_kill_9_and_restart_neither_lose_nor_double_eventalign_rows_or_modbam_records(
        eventalign_tsv, call_outputs, tmp_path):
    seed = int(os.environ.get("STREAMER_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    run = tmp_path / "finished"
    shutil.copytree(ECOLI / "fast5", run / "fast5")
    for name in ("reads.fasta", "reads.bam"):
        shutil.copy(ECOLI / name, run)
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    rep = subprocess.Popen(streamer("replay", run, live, "--interval", "1.0", "--batch-size", "2"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    flags = ["--watch", live, "-g", REFERENCE, "-o", out, "--settle", "0.3", "--poll-interval", "0.1", "--grace",
             "1", "--max-wait", "0.2", "-K", "1", "--eventalign", "--samples", "--modbam"]
    log = open(tmp_path / "daemon.log", "w+")
    kills = []
    try:
        for _ in range(3):
            proc = subprocess.Popen(streamer("run", *flags), stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + TIMEOUT
            while not (out / "eventalign.tsv").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 2.0))
            if proc.poll() is not None:
                break
            proc.kill()
            proc.wait()
            kills.append((out / "eventalign.tsv").stat().st_size)
        assert rep.wait(TIMEOUT) == 0
        proc = subprocess.Popen(streamer("run", *flags), stdout=log, stderr=subprocess.STDOUT)
        assert proc.wait(TIMEOUT * 2) == 0
        # the two windows a kill may hit, made certain: rows appended but not committed, and
        # modBAM copies renamed but not recorded (with a half-written one beside them)
        with open(out / "eventalign.tsv", "a") as fh:
            fh.write("NC_000913.3\t5227\tCGTTCA\tfa9ad683")
        with sqlite3.connect(out / ".streamer" / "ledger.sqlite") as db:
            db.execute("DELETE FROM modbams")
        copies = sorted((out / "modbam").rglob("*.bam"))
        copies[0].with_name(f".{copies[0].name}.tmp").write_bytes(b"BAM\1")
        proc = subprocess.Popen(streamer("run", *flags), stdout=log, stderr=subprocess.STDOUT)
        assert proc.wait(TIMEOUT * 2) == 0
    finally:
        for p in (rep, proc):
            if p.poll() is None:
                p.kill()
                p.wait()
        log.seek(0)
        text = log.read()
        log.close()
    where = f"seed {seed}, killed at eventalign.tsv sizes {kills}"
    assert data_rows(out / "eventalign.tsv") == data_rows(eventalign_tsv("--samples")), where + text[-3000:]
    assert (out / "meth.bed").read_text() == (call_outputs / "meth.bed").read_text(), where
    check_modbams(out, live, call_outputs)


def test_eventalign_messages_split_at_read_boundaries():
    from streamer_plugins.eventalign.sinks import _chunks

    row_off = np.array([0, 5, 50, 51, 200, 203])
    assert list(_chunks(row_off, 10)) == [(0, 50), (50, 200), (200, 203)]
    assert list(_chunks(row_off, 1000)) == [(0, 203)]
    assert list(_chunks(np.array([0, 0]), 10)) == []
