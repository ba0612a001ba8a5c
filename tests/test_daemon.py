"""The daemon in-process, with a stand-in pipeline: lifecycle, exactly-once, bad files, run ends."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from streamer import config
from streamer.daemon.aligner import ReadAligner
from streamer.publish.client import Snapshot, Subscriber
from streamer.daemon.policy import ALL_FILES_IN
from streamer.daemon.shell import Daemon, State
from streamer.io.alignments import AlignmentFilter
from streamer.io.reference import Reference
from streamer.daemon.notify import Notifier
from streamer.publish import Publisher
from streamer.daemon.replay import Replayer, ReplayOptions, load_source

from daemon_support import FakePipeline, no_leaks, rows  # noqa: F401
from streams import local_config, next_of

N_READS, N_RECORDS = 8, 9


@pytest.fixture(scope="module")
def reference(reference_path):
    with Reference(reference_path) as ref:
        yield ref


@pytest.fixture(scope="module")
def source(ecoli):
    return load_source(ecoli)


def replay(source, live: Path, **opts) -> Path:
    return Replayer(source, live, ReplayOptions(**{"speed": 0, "batch_reads": 3, **opts})).run()


def make_config(tmp_path: Path, reference_path: Path, **keys) -> config.Config:
    flat = {"watch.dir": tmp_path / "live", "reference.genome": reference_path, "output.dir": tmp_path / "out",
            "watch.poll_interval": 0.05, "watch.settle": 0.2, "end.final_summary_grace": 0.2,
            "batch.max_wait": 0.1, "service.status_interval": 0.1,
            "pipeline.io_mode": "threads",  # reader processes (the default) are run by test_daemon_e2e
            **keys}
    (tmp_path / "live").mkdir(exist_ok=True)
    return config.build(flat)


def daemon_for(cfg, pipeline, reference, **kw) -> Daemon:
    filt = AlignmentFilter()
    return Daemon(cfg, pipeline, reference, make_aligner=lambda: ReadAligner(cfg.reference.genome, filt), **kw)


def run_to_end(cfg, pipeline, reference, **kw) -> tuple[int, Daemon]:
    d = daemon_for(cfg, pipeline, reference, **kw)
    try:
        code = d.run()
    finally:
        d.close()
    return code, d


def summary(cfg) -> dict:
    return json.loads((cfg.output.dir / "summary.json").read_text())


def skipped(cfg) -> dict[str, str]:
    lines = (cfg.output.dir / "skipped.tsv").read_text().splitlines()[1:]
    return {line.split("\t")[0]: line.split("\t")[1] for line in lines}


def test_a_replayed_run_is_processed_once(source, reference, reference_path, tmp_path, no_leaks):
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path, **{"batch.max_reads": 2})
    pipeline = FakePipeline()
    code, d = run_to_end(cfg, pipeline, reference)
    assert code == 0 and d.state is State.FINISHED and d.ending.reason == ALL_FILES_IN  # it counts its files
    got = rows(cfg.output.dir / "meth.tsv")
    assert len(got) == N_RECORDS == len(set(got))
    assert max(len(set(b)) for b in pipeline.batches) <= 2
    s = summary(cfg)
    assert s["state"] == "finished" and s["reads"]["done"] == s["reads"]["called"] == N_READS
    assert s["records"] == {"considered": N_RECORDS, "called": N_RECORDS, "skipped_by_reason": {}}
    assert s["files"] == {"signal_registered": 3, "basecalls_registered": 3, "basecalls_spare": 3}
    assert s["latency_s"]["max"] >= 0 and s["throughput"]["batches"] >= 4
    assert (cfg.output.dir / "meth-freq.tsv").read_text().startswith("chromosome\tstart\tend\t")
    assert skipped(cfg) == {}
    # a restart after the end finds nothing to do and writes nothing twice
    code, _ = run_to_end(cfg, FakePipeline(), reference)
    assert code == 0 and rows(cfg.output.dir / "meth.tsv") == got


def test_a_backlog_is_taken_in_a_batch_file_at_a_time_and_its_batches_start_in_between(source, reference,
                                                                                      reference_path, tmp_path,
                                                                                      no_leaks):  # fmt: skip
    """A backlog's files are read ahead and taken into the ledger a batch file (its POD5, BAM and FASTQ,
    named alike) at a time; the full batches start in between, not after its last file; what is written
    is the same."""
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path, **{"batch.max_reads": 1})
    d = daemon_for(cfg, FakePipeline(), reference)
    d.start()
    events: list[tuple[str, str]] = []
    real_take, real_submit = d.intake.take, d._submit

    def take(landing) -> None:
        real_take(landing)
        events.append(("intake", landing.outcome.file.path.name.split(".")[0]))

    def submit(picks) -> None:
        events.append(("submit", ""))
        real_submit(picks)

    d.intake.take, d._submit = take, submit
    try:
        assert d.run() == 0
    finally:
        d.close()
    taken = [(i, stem) for i, (what, stem) in enumerate(events) if what == "intake" and "_" in stem]
    assert len({stem for _, stem in taken}) > 1
    for (i, stem), (j, after) in zip(taken, taken[1:]):
        if stem != after:  # between two batch files: batches may start; within one: none does
            continue
        assert ("submit", "") not in events[i:j]
    assert ("submit", "") in events[:taken[-1][0]]
    got = rows(cfg.output.dir / "meth.tsv")
    assert len(got) == N_RECORDS == len(set(got))


def test_read_ahead_changes_when_signal_is_read_not_what_is_written(source, reference, reference_path, tmp_path,
                                                                    no_leaks):
    done = {}
    for ahead in (False, True):
        base = tmp_path / f"read-ahead-{ahead}"
        replay(source, base / "live")
        cfg = make_config(base, reference_path, **{"batch.max_reads": 2, "batch.read_ahead": ahead})
        code, d = run_to_end(cfg, FakePipeline(), reference)
        assert code == 0 and d.state is State.FINISHED
        done[ahead] = sorted(rows(cfg.output.dir / "meth.tsv")), skipped(cfg), d.signal.hits
    assert done[True][:2] == done[False][:2] and len(done[True][0]) == N_RECORDS
    assert done[False][2] == 0 and done[True][2] > 0  # batches after the first found their signal read


def test_fastq_without_bam_is_aligned_with_mappy(source, reference, reference_path, tmp_path, no_leaks):
    replay(source, tmp_path / "with_bam")
    bam_cfg = make_config(tmp_path, reference_path, **{"watch.dir": tmp_path / "with_bam",
                                                       "output.dir": tmp_path / "out_bam"})
    run_to_end(bam_cfg, FakePipeline(), reference)
    replay(source, tmp_path / "live", bam=False)
    cfg = make_config(tmp_path, reference_path)
    code, _ = run_to_end(cfg, FakePipeline(), reference)
    assert code == 0
    assert rows(cfg.output.dir / "meth.tsv") == rows(bam_cfg.output.dir / "meth.tsv")


def test_crash_between_write_and_commit_loses_and_repeats_nothing(source, reference, reference_path, tmp_path,
                                                                   monkeypatch, no_leaks):
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path, **{"batch.max_reads": 2})
    d = daemon_for(cfg, FakePipeline(), reference)
    d.start()
    real_commit, n = d.ledger.commit, []

    def dying_commit(*args, **kw):
        n.append(1)
        if len(n) == 3:  # the second batch's rows are in meth.tsv; its commit never happens
            raise OSError("simulated crash")
        return real_commit(*args, **kw)

    monkeypatch.setattr(d.ledger, "commit", dying_commit)
    assert d.run() == 1 and d.state is State.FAILED
    committed = d.ledger.offsets()["meth.tsv"]
    d.close()
    assert (cfg.output.dir / "meth.tsv").stat().st_size > committed  # rows of an uncommitted batch
    code, _ = run_to_end(cfg, FakePipeline(), reference)
    got = rows(cfg.output.dir / "meth.tsv")
    assert code == 0 and len(got) == N_RECORDS == len(set(got))


class Overlapping(FakePipeline):
    """Notes how many batches are in the stages at once; each stays until a second joins it (or a while)."""

    def __init__(self):
        super().__init__()
        self.inside = self.most = 0
        self._lock = threading.Condition()

    def process(self, reads):
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self._lock.notify_all()
            self._lock.wait_for(lambda: self.most >= 2, timeout=2.0)
        try:
            return super().process(reads)
        finally:
            with self._lock:
                self.inside -= 1


def test_a_backlog_runs_batches_in_the_stages_at_once_and_commits_each_read_once(source, reference, reference_path,
                                                                                tmp_path, no_leaks):
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path, **{"batch.max_reads": 2, "pipeline.compute_threads": 2})
    pipeline = Overlapping()
    code, d = run_to_end(cfg, pipeline, reference)
    assert code == 0 and pipeline.most == 2  # two batches computed at once
    got = rows(cfg.output.dir / "meth.tsv")
    assert len(got) == N_RECORDS == len(set(got)) and summary(cfg)["reads"]["done"] == N_READS


def test_sigterm_finishes_the_batches_in_hand_and_the_rest_waits(source, reference, reference_path, tmp_path,
                                                               no_leaks):
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path, **{"batch.max_reads": 3})
    gate = threading.Event()
    pipeline = FakePipeline(gate=gate)
    d = daemon_for(cfg, pipeline, reference)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("code", d.run()))
    t.start()
    assert pipeline.entered.wait(10)
    d.request_stop()  # what the SIGTERM handler does
    gate.set()
    t.join(10)
    d.close()
    assert result["code"] == 0 and d.state is State.STOPPED and not d.abandoned
    in_hand = len(pipeline.batches)  # the batches in the stages when the stop came: finished, none started after
    assert 1 <= in_hand <= d.driver.compute_threads
    s = summary(cfg)
    assert s["state"] == "stopped" and s["reads"]["done"] == 3 * in_hand
    assert s["reads"]["matched"] <= N_READS - 3 * in_hand  # the files not yet taken in wait on disk
    code, _ = run_to_end(cfg, FakePipeline(), reference)
    got = rows(cfg.output.dir / "meth.tsv")
    assert code == 0 and len(got) == N_RECORDS == len(set(got))


def test_drain_timeout_exits_without_the_batch_in_hand(source, reference, reference_path, tmp_path, no_leaks):
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path, **{"service.drain_timeout": 0.2})
    gate = threading.Event()
    pipeline = FakePipeline(gate=gate)
    d = daemon_for(cfg, pipeline, reference)
    threading.Timer(0.0, lambda: pipeline.entered.wait(10) and d.request_stop()).start()
    t0 = time.monotonic()
    assert d.run() == 0 and d.abandoned
    assert time.monotonic() - t0 < 10
    gate.set()
    d.close()


def test_bad_files_are_set_aside_and_the_rest_goes_on(source, reference, reference_path, tmp_path, no_leaks):
    run = replay(source, tmp_path / "live")
    fast5s = sorted((run / "fast5_pass").iterdir())
    data = fast5s[0].read_bytes()
    fast5s[0].write_bytes(data[: len(data) // 2])  # truncated signal file
    fq = sorted((run / "fastq_pass").iterdir())[1]
    broken = bytearray(fq.read_bytes())
    broken[len(broken) // 2] ^= 0xFF
    fq.write_bytes(bytes(broken))  # corrupt gzip
    shutil.rmtree(run / "bam_pass")
    cfg = make_config(tmp_path, reference_path, **{"watch.incomplete_timeout": 0.3})
    code, d = run_to_end(cfg, FakePipeline(), reference)
    assert code == 0 and d.state is State.FINISHED
    s = summary(cfg)
    reasons = {Path(r["path"]).name: r["reason"] for r in s["rejected_files"]}
    assert set(reasons) == {fast5s[0].name, fq.name}
    assert "truncated" in reasons[fast5s[0].name] and "corrupt gzip" in reasons[fq.name]
    lost = skipped(cfg)
    assert len(lost) == 6 and set(lost.values()) == {"no signal", "no basecall"}  # batches 0 and 1
    assert s["reads"]["called"] == N_READS - 6 and s["reads"]["done"] == N_READS


def test_a_read_the_pipeline_fails_on_is_recorded_and_the_rest_goes_on(source, reference, reference_path,
                                                                        tmp_path, no_leaks):
    replay(source, tmp_path / "live")
    poison = source.reads[0].read_id
    cfg = make_config(tmp_path, reference_path)
    code, d = run_to_end(cfg, FakePipeline(poison={poison}, skip_ids={source.reads[1].read_id}), reference)
    assert code == 0 and d.state is State.FINISHED
    assert skipped(cfg) == {poison: "pipeline error", source.reads[1].read_id: "no events"}
    lost = [len(source.bam_records[r.read_id]) for r in source.reads[:2]]
    assert len(rows(cfg.output.dir / "meth.tsv")) == N_RECORDS - sum(lost)
    s = summary(cfg)
    assert s["reads"]["done"] == N_READS and s["records"]["skipped_by_reason"] == {"pipeline error": lost[0],
                                                                                   "no events": lost[1]}


def test_a_pipeline_that_fails_on_every_read_stops_the_daemon(source, reference, reference_path, tmp_path,
                                                              no_leaks):
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path)
    code, d = run_to_end(cfg, FakePipeline(poison={"*"}), reference)
    assert code == 1 and d.state is State.FAILED and isinstance(d.failure, IndexError)
    s = summary(cfg)
    assert s["state"] == "failed" and s["error"] == "IndexError: index 7 is out of bounds"
    assert s["reads"]["done"] == 0  # nothing recorded: a fixed pipeline redoes them all


def test_stop_file_and_join_timeout(source, reference, reference_path, tmp_path, no_leaks):
    run = replay(source, tmp_path / "live")
    (run / next(p.name for p in run.glob("final_summary*"))).unlink()
    for p in sorted((run / "fast5_pass").iterdir())[1:]:
        p.unlink()  # only the first batch has signal
    cfg = make_config(tmp_path, reference_path, **{"end.follow": True, "join.timeout": 0.3})
    d = daemon_for(cfg, FakePipeline(), reference)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("code", d.run()))
    t.start()
    deadline = time.monotonic() + 10
    while len(skipped(cfg) if (cfg.output.dir / "skipped.tsv").exists() else {}) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(skipped(cfg).values()) == {"no signal"}  # reported after the timeout while the run goes on
    (tmp_path / "live" / "STOP").touch()
    t.join(10)
    d.close()
    assert result["code"] == 0 and d.ending.reason == "STOP file" and d.state is State.FINISHED


def test_idle_timeout_ends_a_plain_folder(ecoli, reference, reference_path, tmp_path, no_leaks):
    live = tmp_path / "live"
    shutil.copytree(ecoli / "fast5", live / "fast5")
    shutil.copy(ecoli / "reads.fasta", live)
    cfg = make_config(tmp_path, reference_path, **{"end.idle_timeout": 0.5})
    code, d = run_to_end(cfg, FakePipeline(), reference)
    assert code == 0 and d.ending.reason.startswith("no new file")
    assert len(rows(cfg.output.dir / "meth.tsv")) == N_RECORDS


def test_notify_protocol(source, reference, reference_path, tmp_path, no_leaks):
    """READY after start-up, WATCHDOG and STATUS while running, STOPPING at the end."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(0.2)
    messages: list[str] = []
    done = threading.Event()

    def listen():
        while not done.is_set():
            try:
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                pass

    listener = threading.Thread(target=listen)
    listener.start()
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path, **{"end.final_summary_grace": 0.5})
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "200000"})
    try:
        code, _ = run_to_end(cfg, FakePipeline(), reference, notifier=notifier)
        time.sleep(0.3)
    finally:
        done.set()
        listener.join()
        sock.close()
    assert code == 0
    assert messages[0].startswith("READY=1\nSTATUS=running: 0 reads done")
    assert "WATCHDOG=1" in messages and any(m.startswith("STATUS=") for m in messages[1:])
    assert messages[-1].startswith("STOPPING=1\nSTATUS=finished: 8 reads done (8 called)")


class RecordingPublisher:
    def __init__(self, fail=False):
        self.got = []
        self.fail = fail

    def __getattr__(self, name):
        def record(*args):
            self.got.append((name, args))
            if self.fail:
                raise RuntimeError("subscriber went away")
        return record


def test_publisher_hook(source, reference, reference_path, tmp_path, no_leaks):
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path)
    pub = RecordingPublisher()
    code, d = run_to_end(cfg, FakePipeline(), reference, publisher=pub)
    assert pub.got[0][0] == "serve_sites" and pub.got[0][1][0].hmm is d.publish.table  # snapshots: the daemon's own table
    del pub.got[0]
    names = [n for n, _ in pub.got]
    assert code == 0 and names[0] == "publish_run" and pub.got[0][1][0] == "start"
    assert pub.got[-1][0] == "publish_run" and pub.got[-1][1][0] == "end"
    calls = [a[0] for n, a in pub.got if n == "publish_calls"]
    assert sum(len(c["read_name"]) for c in calls) == N_RECORDS
    assert set(calls[0]) == {"chromosome", "strand", "start", "end", "read_name", "log_lik_ratio",
                             "log_lik_methylated", "log_lik_unmethylated", "num_calling_strands", "num_motifs",
                             "sequence"}
    freq = [a[0] for n, a in pub.got if n == "publish_freq"]
    assert freq and all(len(f["chromosome"]) == len(f["called_sites"]) for f in freq)
    assert "publish_status" in names


def test_after_a_restart_a_snapshot_holds_the_sites_of_earlier_runs(source, reference, reference_path,
                                                                    tmp_path, no_leaks):
    """The publisher serves the daemon's own table, which a restart rebuilds from meth.tsv."""
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path)
    code, _ = run_to_end(cfg, FakePipeline(), reference)
    freq_tsv = (cfg.output.dir / "meth-freq.tsv").read_text().splitlines()[1:]
    assert code == 0 and len(freq_tsv) > 1
    with Publisher(local_config()) as pub:
        d = daemon_for(cfg, FakePipeline(), reference, publisher=pub)
        try:
            d.start()  # a run over already: nothing new to call
            with Subscriber(pub.endpoints[0], ["meth.freq"]) as sub:
                sites = next_of(sub, Snapshot).sites
        finally:
            d.close()
    got = [f"{c}\t{s}\t{e}\t{n}\t{k}\t{m}\t{f:.3f}\t{q}"
           for c, s, e, n, k, m, f, q in zip(sites.chromosome, sites.start, sites.end, sites.num_motifs_in_group,
                                              sites.called_sites, sites.called_sites_methylated,
                                              sites.methylated_frequency, sites.group_sequence)]
    assert got == freq_tsv


def test_a_failing_publisher_does_not_stop_the_daemon(source, reference, reference_path, tmp_path, caplog):
    replay(source, tmp_path / "live")
    cfg = make_config(tmp_path, reference_path)
    code, d = run_to_end(cfg, FakePipeline(), reference, publisher=RecordingPublisher(fail=True))
    assert code == 0 and d.state is State.FINISHED
    assert "results are still written to files" in caplog.text


def test_a_restarted_run_keeps_the_daemon_until_both_runs_end(source, reference, reference_path, tmp_path,
                                                               no_leaks):
    """Two run folders (MinKNOW adds one when a run is restarted): one final_summary is not the end."""
    first = replay(source, tmp_path / "live", flowcell="FAK00001")
    second = tmp_path / "live" / first.name.replace("FAK00001", "FAK00002")
    (second / "fast5_pass").mkdir(parents=True)
    shutil.copy(next((first / "fast5_pass").iterdir()), second / "fast5_pass" / "FAK00002_pass_x_0.fast5")
    cfg = make_config(tmp_path, reference_path)
    d = daemon_for(cfg, FakePipeline(), reference)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("code", d.run()))
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (cfg.output.dir / "summary.json").exists():
        time.sleep(0.05)
    time.sleep(1.0)  # well past the grace period after the first run's final_summary
    try:
        assert t.is_alive()
    finally:
        (second / "final_summary_FAK00002.txt").write_text("done\n")
        t.join(10)
    d.close()
    assert result["code"] == 0 and d.ending.reason == "final_summary"
    assert len(rows(cfg.output.dir / "meth.tsv")) == N_RECORDS  # the second run's reads are copies


def counted_final_summary(run: Path, **counts: int) -> None:
    """The run's final_summary as MinKNOW writes it: how many files of each format it wrote."""
    lines = "".join(f"{fmt}_files_in_final_dest={n}\n{fmt}_files_in_fallback=0\n" for fmt, n in counts.items())
    next(run.glob("final_summary*")).write_text(f"instrument=MN00000\nbasecalling_enabled=1\n{lines}")


def test_a_finished_run_ends_as_soon_as_every_file_its_final_summary_counts_is_in(source, reference, reference_path,
                                                                                  tmp_path, no_leaks):
    """A backlog does not wait out the grace period: the final_summary counts the files (a FASTQ of a
    fail folder, which the daemon leaves alone, among them) and all are in."""
    run = replay(source, tmp_path / "live")
    (run / "fastq_fail").mkdir()
    shutil.copy(next((run / "fastq_pass").iterdir()), run / "fastq_fail" / "FAK00000_fail_x_0.fastq.gz")
    counted_final_summary(run, fast5=3, pod5=0, fastq=4, bam=3)
    cfg = make_config(tmp_path, reference_path, **{"end.final_summary_grace": 120.0})
    t0 = time.monotonic()
    code, d = run_to_end(cfg, FakePipeline(), reference)
    assert code == 0 and d.state is State.FINISHED and d.ending.reason == ALL_FILES_IN
    assert time.monotonic() - t0 < 60  # seconds, not the 120 s grace
    assert len(rows(cfg.output.dir / "meth.tsv")) == N_RECORDS and summary(cfg)["reads"]["done"] == N_READS


def test_a_final_summary_counting_files_that_never_come_leaves_the_grace_to_end_the_run(source, reference,
                                                                                         reference_path, tmp_path,
                                                                                         no_leaks):
    run = replay(source, tmp_path / "live")
    counted_final_summary(run, fast5=4, fastq=3, bam=3)  # one FAST5 more than landed
    cfg = make_config(tmp_path, reference_path, **{"end.final_summary_grace": 1.0})
    code, d = run_to_end(cfg, FakePipeline(), reference)
    assert code == 0 and d.state is State.FINISHED and d.ending.reason == "final_summary"
    assert len(rows(cfg.output.dir / "meth.tsv")) == N_RECORDS


def test_run_command_builds_the_configured_publisher(tmp_path, reference_path, no_leaks):
    from streamer.commands.run import _publisher
    from streamer.errors import ConfigError

    cfg = make_config(tmp_path, reference_path, **{"publish.endpoint": "tcp://127.0.0.1:*"})
    with _publisher(cfg.publish) as pub:
        assert pub.endpoints[0].startswith("tcp://127.0.0.1:") and pub.snapshot_endpoint is None
    with pytest.raises(ConfigError, match=r"publish.endpoint: tcp://0.0.0.0:\* is beyond loopback"):
        make_config(tmp_path, reference_path, **{"publish.endpoint": "tcp://0.0.0.0:*"})


def skip_rows(cfg) -> list[tuple[str, str]]:
    path = cfg.output.dir / "skipped.tsv"
    lines = path.read_text().splitlines()[1:] if path.exists() else []
    return [tuple(line.split("\t")[:2]) for line in lines]


def wait_for(predicate, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def hold_back_signal(source, tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A replayed run without its first signal file; that file (to land late) and its reads."""
    run = replay(source, tmp_path / "live")
    first = sorted((run / "fast5_pass").iterdir())[0]
    held = Path(shutil.move(first, tmp_path / first.name))
    return held, first, [r.read_id for r in source.reads[:3]]


def reported(cfg, reason: str) -> set[str]:
    return {rid for rid, why in skip_rows(cfg) if why == reason}


def assert_recovered_once(cfg, late: list[str]) -> None:
    """The late reads (and any other read a busy machine let time out) were reported, then
    processed once: their calls in meth.tsv, a `recovered` row after their report."""
    got = rows(cfg.output.dir / "meth.tsv")
    assert len(got) == N_RECORDS == len(set(got))
    assert {r.split("\t")[4] for r in got} >= set(late)
    by_read: dict[str, list[str]] = {}
    for rid, reason in skip_rows(cfg):
        by_read.setdefault(rid, []).append(reason)
    assert set(late) <= set(by_read)
    assert all(reasons in (["no signal", "recovered"], ["no basecall", "recovered"]) for reasons in by_read.values())
    s = summary(cfg)
    assert s["reads"]["done"] == s["reads"]["called"] == N_READS and s["reads"]["recovered"] == len(by_read)
    assert s["records"] == {"considered": N_RECORDS, "called": N_RECORDS, "skipped_by_reason": {}}


def test_a_signal_file_landing_after_the_join_timeout_is_processed(source, reference, reference_path, tmp_path,
                                                                   no_leaks):
    held, home, late = hold_back_signal(source, tmp_path)
    cfg = make_config(tmp_path, reference_path, **{"end.follow": True, "join.timeout": 1.0})
    d = daemon_for(cfg, FakePipeline(), reference)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("code", d.run()))
    t.start()
    try:
        wait_for(lambda: set(late) <= reported(cfg, "no signal"))
        shutil.move(held, home)  # the slow copy lands
        wait_for(lambda: set(late) <= reported(cfg, "recovered"))
    finally:
        (tmp_path / "live" / "STOP").touch()
        t.join(10)
        d.close()
    assert result["code"] == 0 and d.state is State.FINISHED
    assert_recovered_once(cfg, late)


def test_a_late_partner_survives_a_crash_before_its_batch_commits(source, reference, reference_path, tmp_path,
                                                                   monkeypatch, no_leaks):
    held, home, late = hold_back_signal(source, tmp_path)
    cfg = make_config(tmp_path, reference_path, **{"end.follow": True, "join.timeout": 1.0})
    d = daemon_for(cfg, FakePipeline(), reference)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("code", d.run()))
    t.start()
    try:
        wait_for(lambda: set(late) <= reported(cfg, "no signal"))
    finally:
        d.request_stop()
        t.join(10)
        d.close()
    assert result["code"] == 0 and d.state is State.STOPPED
    shutil.move(held, home)  # lands while the daemon is down
    cfg = make_config(tmp_path, reference_path, **{"join.timeout": 1.0})
    d = daemon_for(cfg, FakePipeline(), reference)
    d.start()
    real_commit = d.ledger.commit

    def dying_commit(outcomes, *args, **kw):
        outcomes = list(outcomes)
        if {rid for rid, _ in outcomes} & set(late):  # the late reads' rows are written, never committed
            raise OSError("simulated crash")
        return real_commit(outcomes, *args, **kw)

    monkeypatch.setattr(d.ledger, "commit", dying_commit)
    assert d.run() == 1 and d.state is State.FAILED
    d.close()
    assert set(late) <= reported(cfg, "recovered")  # on disk, not committed
    code, d = run_to_end(cfg, FakePipeline(), reference)
    assert code == 0 and d.state is State.FINISHED
    assert_recovered_once(cfg, late)
