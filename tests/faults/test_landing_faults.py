"""Bad files landing while the daemon runs: each is set aside once with its reason (or recorded as
vanished), the daemon keeps running, every good read is called, and a restart passes them by.

The daemon runs in-process with the stand-in pipeline (`daemon_support.FakePipeline`), so the
suite costs seconds; what is under test is the intake, not the numbers.
"""

from __future__ import annotations

import errno
import gzip
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from streamer.daemon.shell import State
from streamer.io.bamreads import BGZF_EOF
from streamer.daemon.replay import Replayer, ReplayOptions
from streamer.daemon.watch import VANISHED

from daemon_support import FakePipeline, no_leaks, rows  # noqa: F401
from test_daemon import (N_READS, N_RECORDS, daemon_for, make_config, reference, run_to_end, source,  # noqa: F401
                         summary)

INTAKE = "streamer.daemon.intake"


def wait_for(predicate, what: str, timeout: float = 120) -> None:  # a deadline: a cold kernel cache is slow
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def current(cfg) -> dict:
    try:
        return summary(cfg)
    except (FileNotFoundError, ValueError):  # not written yet, or replaced while read
        return {}


def rejected(cfg) -> dict[str, str]:
    return {Path(r["path"]).name: r["reason"] for r in current(cfg).get("rejected_files", [])}


class Running:
    """The daemon on a thread, as `streamer run` runs it."""

    def __init__(self, cfg, reference):
        self.daemon = daemon_for(cfg, FakePipeline(), reference)
        self.code: list[int] = []
        self.thread = threading.Thread(target=lambda: self.code.append(self.daemon.run()))
        self.thread.start()

    def stop(self, live: Path) -> int:
        (live / "STOP").touch()
        self.thread.join(30)
        self.daemon.close()
        assert self.code, "the daemon did not end"
        return self.code[0]

    def abandon(self) -> None:
        """After a failed assertion: stop it as SIGTERM would."""
        if self.thread.is_alive():
            self.daemon.request_stop()
            self.thread.join(30)
        self.daemon.close()


@pytest.fixture
def start(no_leaks, reference):  # noqa: F811 - the fixtures imported above
    """Starts daemons on threads; any still running when a test fails is stopped before the leak check."""
    started: list[Running] = []
    yield lambda cfg: started.append(Running(cfg, reference)) or started[-1]
    for d in started:
        d.abandon()


def corrupt_bams(good: Path) -> dict[str, bytes]:
    """The two shapes that pass the end-of-file check: plain gzip with BGZF's EOF block appended,
    and a real BAM cut mid-block with the EOF block appended."""
    data = good.read_bytes()
    return {"plain_gzip.bam": gzip.compress(gzip.decompress(data)) + BGZF_EOF,
            "cut_mid_block.bam": data[: len(data) // 2] + BGZF_EOF}


def land(path: Path, data: bytes) -> Path:
    """Write beside, then move in: the file lands complete, as MinKNOW's do."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def deny(monkeypatch, path: Path) -> None:
    """Permission denied on opening `path` (the tests run as root, whom a mode does not stop)."""
    real = os.open

    def guarded(p, flags, *args, **kw):
        if os.fspath(p) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(p, flags, *args, **kw)

    monkeypatch.setattr(os, "open", guarded)


def test_bad_files_landing_mid_run_are_named_once_and_a_restart_passes_them(source, reference, reference_path,
                                                                            tmp_path, monkeypatch, caplog,
                                                                            start):
    caplog.set_level(logging.INFO, logger="streamer")
    live = tmp_path / "live"
    run = Replayer(source, live, ReplayOptions(speed=0, batch_reads=3)).run()
    for f in run.glob("final_summary*"):
        f.unlink()
    held = sorted((run / "fast5_pass").iterdir())[-1]  # a good file to land with the bad ones
    held_data = held.read_bytes()
    held.unlink()
    cfg = make_config(tmp_path, reference_path, **{"end.follow": True, "output.refresh_interval": 0.05})
    d = start(cfg)
    wait_for(lambda: current(cfg).get("reads", {}).get("done") == N_READS - 2, "the first batches")

    f5 = run / "fast5_pass"
    bad = {name: land(run / "bam_pass" / name, data)
           for name, data in corrupt_bams(sorted((run / "bam_pass").iterdir())[0]).items()}
    os.symlink("loop_b.fast5", f5 / "loop_a.fast5")
    os.symlink("loop_a.fast5", f5 / "loop_b.fast5")
    locked = f5 / "locked.fast5"
    deny(monkeypatch, locked)
    land(locked, held_data)
    gone = land(f5 / "gone.fast5", held_data[: len(held_data) // 3])  # incomplete: never read before it goes
    time.sleep(0.05)
    gone.unlink()
    land(held, held_data)

    expected = {"plain_gzip.bam", "cut_mid_block.bam", "loop_a.fast5", "loop_b.fast5", "locked.fast5",
                "gone.fast5"}
    wait_for(lambda: set(rejected(cfg)) == expected and current(cfg)["reads"]["done"] == N_READS,
             "every file's outcome")
    assert d.thread.is_alive() and d.daemon.state is State.RUNNING
    reasons = rejected(cfg)
    assert "NotImplementedError" in reasons["plain_gzip.bam"]
    assert reasons["cut_mid_block.bam"].startswith("truncated or corrupt BAM")
    # loop_a is a dangling link until loop_b lands: on a busy machine it may be read in between
    assert reasons["loop_a.fast5"] in ("cannot read (Too many levels of symbolic links)",
                                       "cannot read (a broken symbolic link)")
    assert reasons["loop_b.fast5"] == "cannot read (Too many levels of symbolic links)"
    assert reasons["locked.fast5"] == "cannot read (Permission denied)"
    assert reasons["gone.fast5"] == VANISHED
    lines = [r.getMessage() for r in caplog.records if r.name == INTAKE and r.levelno >= logging.WARNING]
    for name in expected:
        path = bad.get(name) or f5 / name
        assert sum(line.startswith(f"{path}: set aside: ") for line in lines) == 1, name
    assert d.stop(live) == 0 and d.daemon.state is State.FINISHED
    s = summary(cfg)
    assert s["reads"]["called"] == s["reads"]["done"] == N_READS
    assert len(rows(cfg.output.dir / "meth.tsv")) == N_RECORDS

    caplog.clear()
    again = start(cfg)
    assert again.stop(live) == 0 and again.daemon.state is State.FINISHED
    assert not [r for r in caplog.records if r.name == INTAKE and "set aside" in r.getMessage()]
    assert set(rejected(cfg)) == expected
    assert len(rows(cfg.output.dir / "meth.tsv")) == N_RECORDS


def _corrupt_inside(data: bytes) -> bytes:
    """Zeroes from just past the format's signature through the middle, its end (and end marker) kept."""
    return data[:8] + bytes(len(data) // 2 - 8) + data[len(data) // 2:]


@pytest.mark.parametrize("fmt", ["fast5", "pod5", "blow5"])
@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_signal_files_of_every_format_are_set_aside(fmt, damage, source, reference_path, tmp_path,
                                                            start):
    staging = tmp_path / "staging"
    sample = sorted((Replayer(source, staging, ReplayOptions(speed=0, batch_reads=3, signal_format=fmt)).run()
                     / f"{fmt}_pass").iterdir())[0].read_bytes()
    live = tmp_path / "live"
    run = Replayer(source, live, ReplayOptions(speed=0, batch_reads=3)).run()
    for f in run.glob("final_summary*"):
        f.unlink()
    cfg = make_config(tmp_path, reference_path, **{"end.follow": True, "output.refresh_interval": 0.05,
                                                   "watch.incomplete_timeout": 0.3})
    d = start(cfg)
    wait_for(lambda: current(cfg).get("reads", {}).get("done") == N_READS, "the good reads")
    data = sample[: len(sample) // 2] if damage == "truncated" else _corrupt_inside(sample)
    (run / f"{fmt}_pass").mkdir(exist_ok=True)
    name = f"damaged.{fmt}"
    land(run / f"{fmt}_pass" / name, data)
    wait_for(lambda: name in rejected(cfg), "the damaged file's outcome")
    assert d.thread.is_alive()
    reason = rejected(cfg)[name]
    assert reason and "\n" not in reason
    assert d.stop(live) == 0 and d.daemon.state is State.FINISHED
    assert summary(cfg)["reads"]["called"] == N_READS


def test_a_signal_file_deleted_while_its_reads_are_listed_is_recorded_as_vanished(source, reference,
                                                                                   reference_path, tmp_path,
                                                                                   monkeypatch, start):
    from streamer.daemon import intake as daemon_intake

    live = tmp_path / "live"
    run = Replayer(source, live, ReplayOptions(speed=0, batch_reads=3)).run()
    victim = sorted((run / "fast5_pass").iterdir())[0]
    real = daemon_intake.signal_read_ids

    def deleted_first(path):
        if Path(path) == victim:
            Path(path).unlink()
        return real(path)

    monkeypatch.setattr(daemon_intake, "signal_read_ids", deleted_first)
    cfg = make_config(tmp_path, reference_path)
    d = start(cfg)
    d.thread.join(30)
    d.daemon.close()
    assert d.code == [0] and d.daemon.state is State.FINISHED
    assert rejected(cfg) == {victim.name: VANISHED}
    s = summary(cfg)
    assert s["reads"]["done"] == N_READS and s["reads"]["called"] == N_READS - 3  # its three reads: no signal


def test_a_basecall_file_replaced_after_it_was_registered_fails_only_its_reads(source, reference, reference_path,
                                                                               tmp_path, no_leaks):
    """The cache reads a BAM again for reads it let go; by then the file is a corrupt one."""
    live = tmp_path / "live"
    run = Replayer(source, live, ReplayOptions(speed=0, batch_reads=3)).run()
    cfg = make_config(tmp_path, reference_path, **{"join.max_pending_bases": 0})  # nothing held: all read again
    d = daemon_for(cfg, FakePipeline(), reference)
    d.start()
    bam = sorted((run / "bam_pass").iterdir())[0]
    shutil.copy(bam, tmp_path / "bam")
    real_take = d.cache.take

    def replaced_then_take(wanted):
        bam.write_bytes(corrupt_bams(tmp_path / "bam")["cut_mid_block.bam"])
        return real_take(wanted)

    d.cache.take = replaced_then_take
    try:
        assert d.run() == 0
    finally:
        d.close()
    s = summary(cfg)
    assert s["state"] == "finished" and s["reads"]["done"] == N_READS and 0 < s["reads"]["called"] < N_READS


def test_a_run_whose_bams_cannot_be_read_calls_every_read_from_its_fastq(source, reference, reference_path,
                                                                          tmp_path, caplog, no_leaks):
    """The FASTQ/BAM choice is made read by read: each unreadable BAM's reads take the FASTQ of the
    same name, one line says so, and a restart calls nothing twice."""
    caplog.set_level(logging.INFO, logger="streamer")
    plain = tmp_path / "plain"
    Replayer(source, plain / "live", ReplayOptions(speed=0, batch_reads=3, bam=False)).run()
    fastq_only = make_config(plain, reference_path)
    assert run_to_end(fastq_only, FakePipeline(), reference)[0] == 0

    run = Replayer(source, tmp_path / "live", ReplayOptions(speed=0, batch_reads=3)).run()
    bams = sorted((run / "bam_pass").iterdir())
    bad = corrupt_bams(bams[0])["cut_mid_block.bam"]
    for bam in bams:
        bam.write_bytes(bad)
    cfg = make_config(tmp_path, reference_path)
    code, d = run_to_end(cfg, FakePipeline(), reference)
    assert code == 0 and d.state is State.FINISHED
    s = summary(cfg)
    assert s["reads"]["called"] == s["reads"]["done"] == N_READS
    assert rows(cfg.output.dir / "meth.tsv") == rows(fastq_only.output.dir / "meth.tsv")
    lines = [r.getMessage() for r in caplog.records if r.name == INTAKE and "take their basecalls" in r.getMessage()]
    assert len(lines) == len(bams)
    for bam in bams:
        fastq = run / "fastq_pass" / bam.name.replace(".bam", ".fastq.gz")
        line, = [x for x in lines if f"{bam} could not be read (truncated or corrupt BAM" in x]
        assert line.startswith(f"{fastq}: 3 reads take their basecalls from this FASTQ: ") or \
            line.startswith(f"{fastq}: 2 reads take their basecalls from this FASTQ: ")

    caplog.clear()
    assert run_to_end(cfg, FakePipeline(), reference)[0] == 0
    assert rows(cfg.output.dir / "meth.tsv") == rows(fastq_only.output.dir / "meth.tsv")
    assert not [r for r in caplog.records if "take their basecalls" in r.getMessage()]


def test_a_bam_set_aside_after_its_fastq_was_kept_as_spare_passes_its_reads_to_it(source, reference,
                                                                                    reference_path, tmp_path,
                                                                                    caplog, start):
    """The FASTQ lands first (kept as the spare), then its BAM lands unreadable mid-run."""
    caplog.set_level(logging.INFO, logger="streamer")
    run = Replayer(source, tmp_path / "live", ReplayOptions(speed=0, batch_reads=3)).run()
    for f in run.glob("final_summary*"):
        f.unlink()
    bam = sorted((run / "bam_pass").iterdir())[0]
    shutil.move(bam, tmp_path / "good.bam")
    cfg = make_config(tmp_path, reference_path, **{"end.follow": True, "output.refresh_interval": 0.05})
    d = start(cfg)
    wait_for(lambda: current(cfg).get("reads", {}).get("done") == N_READS - 3, "the reads with a BAM")
    land(bam, corrupt_bams(tmp_path / "good.bam")["cut_mid_block.bam"])
    wait_for(lambda: current(cfg)["reads"]["done"] == N_READS, "the reads of the unreadable BAM")
    assert d.stop(tmp_path / "live") == 0
    s = summary(cfg)
    assert s["reads"]["called"] == N_READS and len(rows(cfg.output.dir / "meth.tsv")) == N_RECORDS
    lines = [r.getMessage() for r in caplog.records if "take their basecalls" in r.getMessage()]
    assert len(lines) == 1 and f"{bam} could not be read" in lines[0], lines
