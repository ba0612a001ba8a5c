"""Replay: a finished run re-enacted as MinKNOW writes one, at a scaled pace; staged, then moved in fast."""

from __future__ import annotations

import gzip
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pysam
import pytest

from streamer.io.fast5 import fast5_read_ids, read_fast5
from streamer.daemon.replay import Replayer, load_source
from streamer.daemon.replay_plan import BatchTiming, Landing, Pace, ReplayOptions, plan
from streamer.daemon.runfolder import Kind, RunLayout
from streamer.daemon.staged import MANIFEST, load_staged, replay_staged, stage

from daemon_support import no_leaks  # noqa: F401


@pytest.fixture(scope="module")
def source(ecoli):
    return load_source(ecoli)


def test_source_has_reads_in_end_time_order(source):
    assert len(source.reads) == 8 and len(source.basecalls) == 8
    ends = [r.end_s for r in source.reads]
    assert ends == sorted(ends)
    assert source.bam_header is not None and sum(map(len, source.bam_records.values())) == 9


def test_plan_paces_batches(source):
    t0 = min(r.start_s for r in source.reads)
    timings = Replayer(source, "unused", ReplayOptions(batch_reads=3)).timings
    fast = plan(timings, ReplayOptions(speed=100), bam=False)
    assert [(x.batch, x.kind) for x in fast] == [(0, "signal"), (0, "fastq"), (1, "signal"), (1, "fastq"),
                                                 (2, "signal"), (2, "fastq")]
    assert fast[-1].at == pytest.approx((source.reads[-1].end_s - t0) / 100)
    lagged = plan(timings[:2], ReplayOptions(interval=2, basecall_lag=-1), bam=True)
    assert lagged == [Landing(0, 0, "signal"), Landing(0, 0, "fastq"), Landing(0, 0, "bam"),
                      Landing(1, 1, "fastq"), Landing(1, 1, "bam"), Landing(2, 1, "signal")]
    # by bases: a batch lands when it and those before it would have been sequenced at the rate
    by_bases = plan([BatchTiming(9.0, 2_000_000), BatchTiming(1.0, 1_000_000)], ReplayOptions(mbases_per_s=2), bam=False)
    assert [x.at for x in by_bases if x.kind == "signal"] == [1.0, 1.5]
    assert sum(t.bases for t in timings) == sum(len(s) for s, _ in source.basecalls.values())


def test_replay_writes_a_minknow_run(source, ecoli, tmp_path, no_leaks):
    fake = FakeTime()
    r = Replayer(source, tmp_path, ReplayOptions(speed=1000, batch_reads=3), sleep=fake.sleep, clock=fake.clock)
    run = r.run()
    assert run.parent == tmp_path and run.name.endswith(f"_{source.run_id[:8]}")
    stems = [r.stem(i) for i in range(3)]
    for sub, ext in (("fast5_pass", "fast5"), ("fastq_pass", "fastq.gz"), ("bam_pass", "bam")):
        assert sorted(p.name for p in (run / sub).iterdir()) == [f"{s}.{ext}" for s in stems]
    assert not (run / ".replay").exists()
    assert len(list(run.glob("final_summary_*.txt"))) == 1 and len(list(run.glob("sequencing_summary_*"))) == 1
    assert fake.t == pytest.approx(r_last(source) / 1000)  # the last batch lands when its last read ended
    layout = RunLayout(tmp_path)
    kinds = sorted(layout.classify(p).kind.value for p in run.rglob("*") if p.is_file() and layout.classify(p))
    assert kinds.count(Kind.SIGNAL.value) == 3 and kinds.count(Kind.FINAL_SUMMARY.value) == 1
    # the signal is the source's, sample for sample, read through the FAST5 reader
    f5 = run / "fast5_pass" / f"{stems[0]}.fast5"
    ids = fast5_read_ids(f5)
    assert ids == sorted(r.read_id for r in source.reads[:3])
    src = next(r for r in source.reads if r.read_id == ids[0])
    a, b = read_fast5(f5, ids[0]), read_fast5(src.signal_file, ids[0])
    assert (a.raw == b.raw).all() and (a.offset, a.range, a.digitisation) == (b.offset, b.range, b.digitisation)
    with gzip.open(run / "fastq_pass" / f"{stems[0]}.fastq.gz", "rt") as fh:
        assert fh.readline().startswith(f"@{source.reads[0].read_id} runid=")
    with pysam.AlignmentFile(str(run / "bam_pass" / f"{stems[0]}.bam")) as fh:
        assert {rec.query_name for rec in fh} == set(ids)


class FakeTime:
    def __init__(self):
        self.t = 0.0

    def sleep(self, s: float) -> None:
        self.t += s

    def clock(self) -> float:
        return self.t


def r_last(source):
    return source.reads[-1].end_s - min(r.start_s for r in source.reads)


def test_replay_in_place_without_bam(source, tmp_path, no_leaks):
    opts = ReplayOptions(speed=0, batch_reads=8, mode="inplace", write_seconds=0.01, bam=False, compression="gzip")
    run = Replayer(source, tmp_path, opts).run()
    assert not (run / "bam_pass").exists()
    assert len(fast5_read_ids(next((run / "fast5_pass").iterdir()))) == 8


def test_replay_command(ecoli, tmp_path, capsys):
    from streamer.cli import main

    assert main(["replay", str(ecoli), str(tmp_path), "--speed", "0", "--batch-size", "5", "--no-bam"]) == 0
    run = tmp_path / capsys.readouterr().out.strip()
    assert len(list((run / "fast5_pass").iterdir())) == 2


STARTED = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
TIMES = ("acquisition_stopped=", "processing_stopped=")


def _contents(run):
    """Every file of a run folder by its path inside it; the final summary without its stop times."""
    out = {}
    for p in sorted(run.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name.startswith("final_summary"):
                data = b"".join(x for x in data.splitlines(True) if not x.decode().startswith(TIMES))
            out[str(p.relative_to(run))] = data
    return out


def test_staged_replay_moves_in_what_the_replay_writes(source, tmp_path, no_leaks, monkeypatch):
    opts = ReplayOptions(speed=0, batch_reads=3)
    written = Replayer(source, tmp_path / "written", opts, started=STARTED).run()
    staged = stage(source, tmp_path / "staged", opts, started=STARTED)
    assert staged.name == written.name and (staged / MANIFEST).is_file()

    landed = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (landed.append(Path(b).name), replace(a, b))[1])
    run, pace = replay_staged(load_staged(staged), tmp_path / "live", ReplayOptions(speed=0))
    monkeypatch.undo()
    assert run == tmp_path / "live" / written.name and not staged.exists()
    assert _contents(run) == _contents(written)  # the same names, the same bytes
    assert sorted(landed) == sorted(Path(f).name for f in _contents(written))
    assert landed[-2].startswith("sequencing_summary") and landed[-1].startswith("final_summary")
    assert (pace.batches, pace.bases) == (3, sum(len(s) for s, _ in source.basecalls.values()))
    final = next(run.glob("final_summary_*")).read_text()
    assert "fast5_files_in_final_dest=3\n" in final and "fastq_files_in_final_dest=3\n" in final
    assert "bam_files_in_final_dest=3\n" in final and "pod5_files_in_final_dest=0\n" in final
    assert not (run / ".replay").exists()


def test_staging_in_several_processes_writes_the_same_bytes(source, tmp_path, capsys):
    from streamer.cli import main

    opts = ReplayOptions(batch_reads=3)
    one = stage(source, tmp_path / "one", opts, started=STARTED)
    two = stage(source, tmp_path / "two", opts, started=STARTED, workers=2)
    assert len(_contents(one)) == 3 * 3 + 3 and _contents(two) == _contents(one)  # 3 batches, BAM included
    with pytest.raises(ValueError, match="as fast as it can"):
        Replayer(source, tmp_path / "paced", ReplayOptions(mbases_per_s=1.0, batch_reads=3)).run(workers=2)
    assert main(["replay", str(one), str(tmp_path / "live"), "-t", "2"]) == 2  # a paced replay: one line
    assert "is for --stage-only" in capsys.readouterr().err


def _listing(live):
    """The files that have landed in the live folder (its staging folders, which the replay makes and removes while
    this looks, passed over: `os.walk` skips a folder that vanishes under it, where `rglob` raises)."""
    found = []
    for _, folders, files in os.walk(live):
        folders[:] = [f for f in folders if f != ".replay"]
        found += files
    return found


def test_staged_replay_keeps_the_asked_pace(source, tmp_path, no_leaks):
    """Ten batches at 1 Mbase/s: about the time their bases take (generous bounds: the machine is busy)."""
    staged = stage(source, tmp_path / "staged", ReplayOptions(batch_reads=1, bam=False))
    manifest = load_staged(staged)
    n = len(manifest.timings)
    bases = sum(t.bases for t in manifest.timings)
    rate = bases / 1e6 / 2.0  # the whole run in 2 s
    arrivals = {}
    stop = threading.Event()

    def watch():
        while True:
            done = stop.is_set()
            for name in _listing(tmp_path / "live"):
                arrivals.setdefault(name, time.monotonic())
            if done:
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.monotonic()
    try:
        _, pace = replay_staged(manifest, tmp_path / "live", ReplayOptions(mbases_per_s=rate), keep=True)
    finally:
        stop.set()
        watcher.join()
    took = time.monotonic() - t0
    assert n == 8 and staged.exists()
    assert 1.5 < took < 30 and pace.seconds == pytest.approx(took, abs=0.5)
    assert pace.mbases_per_s == pytest.approx(bases / 1e6 / pace.seconds)
    signal = sorted(t for name, t in arrivals.items() if name.endswith(".fast5"))
    assert len(signal) == n and signal[0] - t0 < 1.5 and signal[-1] - t0 > 1.0  # spread out, not all at once
    assert "replayed 8 batches" in pace.line()
    late, on_time = Pace(2, 48_000_000, 10.0, 2.0), Pace(2, 48_000_000, 2.05, 2.0)
    assert late.warning() == "the replay fell behind: asked 24.00 Mbases/s (2.00 s), kept 4.80 Mbases/s (10.00 s)"
    assert on_time.warning() is None and on_time.line() == "replayed 2 batches, 48.00 Mbases in 2.05 s: 23.41 Mbases/s"


def test_stage_then_fast_replay_command(ecoli, tmp_path, capsys):
    from streamer.cli import main

    assert main(["replay", str(ecoli), str(tmp_path / "staged"), "--stage-only", "--batch-size", "5",
                 "--signal-format", "pod5", "--no-bam"]) == 0
    staged = tmp_path / "staged" / capsys.readouterr().out.strip()
    assert main(["replay", str(staged), str(tmp_path / "again"), "--stage-only"]) == 2  # staged already: one line
    assert "is staged already" in capsys.readouterr().err
    assert main(["replay", str(staged), str(tmp_path / "live"), "--mbases-per-s", "1000"]) == 0
    out = capsys.readouterr()
    run = tmp_path / "live" / out.out.strip()
    assert len(list((run / "pod5_pass").iterdir())) == 2 and not staged.exists()
    assert "replayed 2 batches" in out.err and "Mbases/s" in out.err
    final = next(run.glob("final_summary_*")).read_text()
    assert "pod5_files_in_final_dest=2\n" in final and "bam_files_in_final_dest=0\n" in final
