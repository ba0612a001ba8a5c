"""How the daemon ends when its outputs fail: a full disk leaves summary.json saying `failed` and why,
no temporary table behind, and a restart once space returns that loses and repeats nothing; a
second daemon on the same output folder is refused whatever its state folder; the drain timeout
is logged as given."""

from __future__ import annotations

import contextlib
import errno
import logging
import subprocess
import threading
from pathlib import Path

from streamer import cli
from streamer.daemon.shell import State
from streamer.daemon.journal import Journal
from streamer.daemon.replay import Replayer, ReplayOptions

from daemon_support import FakePipeline, no_leaks, rows  # noqa: F401
from test_daemon import N_READS, N_RECORDS, daemon_for, make_config, reference, source, summary  # noqa: F401
from test_landing_faults import current, land, start, wait_for  # noqa: F401

FS_BYTES = 4 << 20


@contextlib.contextmanager
def small_filesystem(where: Path):
    """A 4 MiB tmpfs at `where` when this user may mount one (root in a container); else None."""
    where.mkdir()
    try:
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(where)],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        made = False
    try:
        yield where if made else None
    finally:
        if made:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=10)


def fill(fs: Path) -> Path:
    """Fill the file system to the last byte."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as fh:
        for chunk in (1 << 16, 1 << 10, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(bytes(chunk))
    return filler


def test_a_full_disk_fails_with_the_summary_saying_so_and_a_restart_finishes(source, reference_path, tmp_path,
                                                                           monkeypatch, start, caplog):
    live = tmp_path / "live"
    run = Replayer(source, live, ReplayOptions(speed=0, batch_reads=3)).run()
    for f in run.glob("final_summary*"):
        f.unlink()
    held = sorted((run / "fast5_pass").iterdir())[-1]
    held_data = held.read_bytes()
    held.unlink()
    with small_filesystem(tmp_path / "small") as fs:
        out = fs / "out" if fs is not None else tmp_path / "out"
        cfg = make_config(tmp_path, reference_path, **{"end.follow": True, "output.dir": out,
                                                       "output.refresh_interval": 0.05})
        d = start(cfg)
        wait_for(lambda: current(cfg).get("reads", {}).get("done") == N_READS - 2, "the first batches")
        if fs is not None:
            filler = fill(fs)
        else:  # no small file system to be had: the next append fails as a full one would
            def full(self, lines):
                raise OSError(errno.ENOSPC, "No space left on device")
            monkeypatch.setattr(Journal, "append", full)
        land(held, held_data)
        d.thread.join(30)
        d.daemon.close()
        assert d.code == [1] and d.daemon.state is State.FAILED
        failed = [r for r in caplog.records if r.getMessage().startswith("daemon failed")]
        assert len(failed) == 1 and not failed[0].exc_info  # one line: a full disk is no bug to trace
        s = summary(cfg)
        assert s["state"] == "failed" and ("No space left on device" in s["error"] or "disk is full" in s["error"])
        assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
        if fs is not None:
            filler.unlink()
        else:
            monkeypatch.undo()
        (live / "STOP").touch()
        again = start(cfg)
        again.thread.join(30)
        again.daemon.close()
        assert again.code == [0] and again.daemon.state is State.FINISHED
        got = rows(out / "meth.tsv")
        assert len(got) == N_RECORDS == len(set(got))
        s = summary(cfg)
        assert s["state"] == "finished" and s["reads"]["called"] == N_READS and s["error"] is None


def test_a_second_daemon_on_the_same_output_folder_is_refused_whatever_its_state_folder(source, reference_path,
                                                                                       tmp_path, start, capsys, caplog):
    live = tmp_path / "live"
    run = Replayer(source, live, ReplayOptions(speed=0, batch_reads=3)).run()
    for f in run.glob("final_summary*"):
        f.unlink()
    cfg = make_config(tmp_path, reference_path, **{"end.follow": True, "output.refresh_interval": 0.05})
    caplog.set_level(logging.INFO, logger="streamer.daemon.shell")
    first = start(cfg)
    wait_for(lambda: current(cfg).get("reads", {}).get("done") == N_READS, "the first daemon's reads")
    # the first daemon logs each batch after committing it: its last line must not land in the second's stderr
    wait_for(lambda: sum(r.args[0] for r in caplog.records if r.msg.startswith("batch of ")) == N_READS,
             "the first daemon's batch lines")
    before = (cfg.output.dir / "meth.tsv").read_bytes()
    code = cli.main(["run", "--watch", str(live), "-g", str(reference_path), "-o", str(cfg.output.dir),
                     "--state-dir", str(tmp_path / "elsewhere")])
    # a fresh machine's first `run` also says, before the configuration is read, that kernels compile
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("compiling kernels")]
    assert code == 78
    assert err == [f"streamer run: configuration error: output.dir {cfg.output.dir}: another streamer daemon "
                   f"(pid {__import__('os').getpid()}) writes to this output folder; give each daemon its own"]
    assert (cfg.output.dir / "meth.tsv").read_bytes() == before
    assert first.thread.is_alive()
    assert first.stop(live) == 0


def test_the_drain_timeout_is_logged_as_given(source, reference, reference_path, tmp_path, caplog, no_leaks):
    Replayer(source, tmp_path / "live", ReplayOptions(speed=0, batch_reads=3)).run()
    cfg = make_config(tmp_path, reference_path, **{"service.drain_timeout": 0.15})
    gate = threading.Event()
    pipeline = FakePipeline(gate=gate)
    d = daemon_for(cfg, pipeline, reference)
    threading.Timer(0.0, lambda: pipeline.entered.wait(10) and d.request_stop()).start()
    assert d.run() == 0 and d.abandoned
    gate.set()
    d.close()
    assert "the batch in hand did not finish within 0.15 s" in caplog.text
