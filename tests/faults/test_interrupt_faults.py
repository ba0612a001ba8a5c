"""Ctrl-C and kill -9 as a user's terminal and systemd deliver them: to the whole process group of a
real `streamer call` or `streamer run`, whose signal readers are processes. One line, no traceback
from any process of the group, and nothing left behind that a restart would hear from."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ECOLI, REFERENCE, ROOT

TIMEOUT = 300  # a cold kernel cache compiles for about a minute on a busy machine


def streamer(*args: object) -> list[str]:
    return [sys.executable, "-m", "streamer", *map(str, args)]


def group(pgid: int) -> list[int]:
    """The processes of a process group."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rpartition(b")")[2].split()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and int(fields[2]) == pgid and fields[0] != b"Z":
            pids.append(int(entry))
    return pids


def wait_for(predicate, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def started(argv: list[str], log: Path) -> subprocess.Popen:
    """The command in a process group of its own (as a terminal's foreground job), stderr to `log`."""
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)


def ctrl_c(proc: subprocess.Popen) -> int:
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(TIMEOUT)
    wait_for(lambda: not group(proc.pid), "the readers to end with their owner", 30)
    return code


def assert_no_traceback(text: str) -> None:
    for noise in ("Traceback", "KeyboardInterrupt", "ForkServerProcess", "leaked"):
        assert noise not in text, text


def test_ctrl_c_ends_call_with_one_line_and_the_resume_hint(tmp_path):
    log, out = tmp_path / "stderr", tmp_path / "meth.tsv"
    proc = started(streamer("call", "-r", ECOLI / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE,
                            "--signal", ECOLI / "fast5", "-o", out, "-K", "1", "--io-mode", "processes"), log)
    # the signal readers are up (the owner, its resource tracker, the fork server and a reader)
    wait_for(lambda: len(group(proc.pid)) >= 4 or proc.poll() is not None, "the signal readers")
    assert ctrl_c(proc) == 130
    text = log.read_text()
    assert_no_traceback(text)
    last = text.splitlines()[-1]
    assert last.startswith("streamer call: interrupted;") and "--resume" in last and str(out) in last
    assert sum("interrupted" in line for line in text.splitlines()) == 1


def test_ctrl_c_stops_run_naming_the_signal_without_a_traceback(tmp_path):
    live, log = tmp_path / "live", tmp_path / "stderr"
    shutil.copytree(ECOLI / "fast5", live / "fast5")
    shutil.copy(ECOLI / "reads.bam", live)
    proc = started(streamer("run", "--watch", live, "-g", REFERENCE, "-o", tmp_path / "out", "--settle", "0.3",
                            "--poll-interval", "0.1", "--max-wait", "0.2", "--follow", "--io-mode", "processes"), log)
    wait_for(lambda: "batch of " in log.read_text() or proc.poll() is not None, "the first batch")
    assert ctrl_c(proc) == 0
    text = log.read_text()
    assert_no_traceback(text)
    assert text.count("stop requested (SIGINT)") == 1 and "SIGTERM" not in text
    assert "now have signal and basecalls" not in text  # one line per batch, not one per file (-v shows those)


_KILLED = """
import os, signal, sys
sys.path[:0] = sys.argv[1:]
from streamer.pipeline.signal_pool import signal_readers
pool = signal_readers([".fast5"], 2, "processes")
pool.submit(os.getpid).result()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_kill_9_of_the_owner_leaves_no_warning_for_the_next_start(tmp_path):
    """The resource tracker outlives its owner, unlinks the readers' semaphores, and says nothing
    (under systemd, its warning would land in the restarted daemon's log)."""
    log = tmp_path / "stderr"
    proc = started([sys.executable, "-c", _KILLED, str(ROOT / "plugins"), str(ROOT / "gpu"), str(ROOT)], log)
    assert proc.wait(TIMEOUT) == -signal.SIGKILL
    wait_for(lambda: not group(proc.pid), "the readers and the tracker to end", 30)
    assert log.read_text() == ""
