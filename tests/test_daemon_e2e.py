"""End to end, real processes and real files: `streamer replay` into a folder that `streamer run`
watches; the daemon's final TSV must have exactly the rows of `streamer call` on the same reads,
through a kill -9 and restart, around corrupt files, and with files written slowly in place."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamer.io.signal import signal_read_ids

from conftest import ECOLI, REFERENCE, SHARED, needs_shared
from daemon_support import rows

TIMEOUT = 60


def streamer(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamer", *map(str, args)]


@pytest.fixture(scope="module")
def fixture_copy(tmp_path_factory) -> Path:
    """The fixture's run files, copied so nothing is written beside the repository's."""
    d = tmp_path_factory.mktemp("finished_run")
    shutil.copytree(ECOLI / "fast5", d / "fast5")
    shutil.copy(ECOLI / "reads.fasta", d)
    shutil.copy(ECOLI / "reads.bam", d)
    return d


def call_rows(run: Path, out: Path) -> list[str]:
    """What `streamer call` writes for a finished run's reads (rows sorted: batch order differs)."""
    subprocess.run(streamer("call", "-r", run / "reads.fasta", "-b", run / "reads.bam", "-g", REFERENCE,
                            "--signal", run / "fast5", "-o", out), check=True, capture_output=True, timeout=300)
    return rows(out)


@pytest.fixture(scope="module")
def expected(fixture_copy, tmp_path_factory) -> list[str]:
    got = call_rows(fixture_copy, tmp_path_factory.mktemp("call") / "meth.tsv")
    assert len(got) > 700
    return got


class Daemon:
    """`streamer run` as a child process, with a fake systemd notify socket."""

    def __init__(self, tmp: Path, live: Path, out: Path, *flags: str):
        self.notify_path = tmp / f"notify-{time.monotonic_ns()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.notify_path))
        self.sock.settimeout(0.1)
        self.messages: list[str] = []
        self.ready = threading.Event()
        self._done = threading.Event()
        self._listener = threading.Thread(target=self._listen)
        self._listener.start()
        env = {**os.environ, "NOTIFY_SOCKET": str(self.notify_path), "WATCHDOG_USEC": "1000000",
               "STREAMER_SLOW5_INDEX_DIR": str(tmp / "slow5-index")}
        self.log = open(tmp / f"daemon-{time.monotonic_ns()}.log", "w+")
        self.proc = subprocess.Popen(
            streamer("run", "--watch", live, "-g", REFERENCE, "-o", out, "--settle", "0.3", "--poll-interval",
                     "0.1", "--grace", "1", "--max-wait", "0.2", "--status-interval", "0.2", *flags),
            stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def _listen(self) -> None:
        while not self._done.is_set():
            try:
                msg = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            self.messages.append(msg)
            if msg.startswith("READY=1"):
                self.ready.set()

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.close()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self._done.is_set():
            self._done.set()
            self._listener.join()
            self.sock.close()
            self.log.flush()


@pytest.fixture
def daemons():
    started: list[Daemon] = []
    yield lambda *a: started.append(Daemon(*a)) or started[-1]
    for d in started:
        d.close()
        d.log.close()


def replay(src: Path, live: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(streamer("replay", src, live, *flags), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_replayed_run_gives_the_rows_of_streamer_call(fixture_copy, expected, daemons, tmp_path):
    """Done-when 1: several MinKNOW batch files land while the daemon watches."""
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    d = daemons(tmp_path, live, out, "--trace", tmp_path / "trace.json")
    rep = replay(fixture_copy, live, "--interval", "0.3", "--batch-size", "3")
    assert rep.wait(TIMEOUT) == 0
    assert d.wait() == 0, d.output()
    assert rows(out / "meth.tsv") == expected
    # its timeline: each landed file taken in, each batch's basecalls taken, through the stages and committed
    spans = {e["name"] for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert {"intake", "basecalls", "batch", "events", "abea", "commit"} <= spans
    s = summary(out)
    assert s["state"] == "finished" and s["reads"]["called"] == 8 and s["rejected_files"] == []
    # the notify protocol: status while loading, READY once warm, then WATCHDOG and STATUS, STOPPING last
    kinds = [m.split("=")[0] for m in d.messages]
    assert d.messages[0] == "STATUS=loading models and compiling kernels"
    assert kinds.index("READY") < kinds.index("WATCHDOG") and kinds.count("READY") == 1
    assert kinds[-1] == "STOPPING" and "STATUS" in kinds[kinds.index("READY") + 1 :]
    assert (out / "meth-freq.tsv").read_text().count("\n") > 100


@needs_shared
def test_shared_reads_replayed_give_the_rows_of_streamer_call(daemons, tmp_path):
    """Done-when 1 on the 112 shared reads, in 7 MinKNOW batch files."""
    run = tmp_path / "finished"
    run.mkdir()
    (run / "fast5").symlink_to(SHARED / "fast5_files")
    (run / "reads.fasta").symlink_to(SHARED / "reads.fasta")
    (run / "reads.bam").symlink_to(SHARED / "reads.mg1655.sorted.bam")
    want = call_rows(run, tmp_path / "call.tsv")
    assert len(want) > 19_000
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    d = daemons(tmp_path, live, out)
    rep = replay(run, live, "--interval", "0.5", "--batch-size", "16")
    assert rep.wait(TIMEOUT) == 0
    assert d.wait() == 0, d.output()
    assert rows(out / "meth.tsv") == want
    s = summary(out)
    assert s["reads"]["done"] == 112 and s["files"]["signal_registered"] == 7
    assert s["records"]["skipped_by_reason"] == {"low mapq": 2}


def test_kill_9_and_restart_give_the_same_rows(fixture_copy, expected, daemons, tmp_path):
    """Done-when 2: kill -9 at random points (after READY, mid-run), restart, same final output."""
    seed = int(os.environ.get("STREAMER_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    rep = replay(fixture_copy, live, "--interval", "0.4", "--batch-size", "2")
    kills = []
    for _ in range(3):
        d = daemons(tmp_path, live, out, "-K", "1")
        assert d.ready.wait(TIMEOUT), d.output()
        time.sleep(rng.uniform(0.0, 1.0))
        if d.proc.poll() is not None:
            break
        d.kill()
        kills.append((out / "meth.tsv").stat().st_size)
    assert rep.wait(TIMEOUT) == 0
    d = daemons(tmp_path, live, out, "-K", "1")
    assert d.wait() == 0, f"seed {seed}: {d.output()}"
    assert rows(out / "meth.tsv") == expected, f"seed {seed}, killed at meth.tsv sizes {kills}"
    assert summary(out)["reads"]["done"] == 8


def test_sigterm_drains_and_a_restart_finishes(fixture_copy, expected, daemons, tmp_path):
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    rep = replay(fixture_copy, live, "--interval", "0.3", "--batch-size", "3")
    d = daemons(tmp_path, live, out, "-K", "1")
    assert d.ready.wait(TIMEOUT)
    time.sleep(0.5)
    d.proc.send_signal(signal.SIGTERM)
    assert d.wait() == 0, d.output()
    assert any(m.startswith("STOPPING=1") for m in d.messages)
    assert summary(out)["state"] in ("stopped", "finished")
    assert rep.wait(TIMEOUT) == 0
    assert daemons(tmp_path, live, out).wait() == 0
    assert rows(out / "meth.tsv") == expected


def test_corrupt_files_are_set_aside_and_the_daemon_keeps_running(fixture_copy, expected, daemons, tmp_path):
    """Done-when 3: a truncated FAST5 and a corrupt FASTQ are reported (file, reason); the rest is called."""
    staging = tmp_path / "staging"
    subprocess.run(streamer("replay", fixture_copy, staging, "--speed", "0", "--batch-size", "3", "--no-bam"),
                   check=True, capture_output=True, timeout=TIMEOUT)
    run = next(staging.iterdir())
    for f in run.glob("final_summary*"):
        f.unlink()
    bad_f5 = sorted((run / "fast5_pass").iterdir())[0]
    bad_f5.write_bytes(bad_f5.read_bytes()[:5000])
    bad_fq = sorted((run / "fastq_pass").iterdir())[2]
    data = bytearray(bad_fq.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad_fq.write_bytes(bytes(data))
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    run = Path(shutil.move(run, live / run.name))
    bad_f5, bad_fq = run / "fast5_pass" / bad_f5.name, run / "fastq_pass" / bad_fq.name
    d = daemons(tmp_path, live, out, "--follow", "--incomplete-timeout", "1")
    assert d.ready.wait(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        s = summary(out) if (out / "summary.json").exists() else {}
        if len(s.get("rejected_files", [])) == 2 and s["reads"]["matched"] == 0 and s["reads"]["done"] >= 2:
            break
        time.sleep(0.2)
    assert d.proc.poll() is None  # still running, still watching
    reasons = {Path(r["path"]).name: r["reason"] for r in s["rejected_files"]}
    assert "truncated" in reasons[bad_f5.name] and "corrupt gzip" in reasons[bad_fq.name]
    log = d.output()
    assert f"{bad_f5}: set aside: truncated" in log and f"{bad_fq}: set aside: corrupt gzip" in log
    (live / "STOP").touch()
    assert d.wait() == 0
    lost = {line.split("\t")[0] for line in (out / "skipped.tsv").read_text().splitlines()[1:]}
    assert len(lost) == 5  # 3 reads without signal, 2 without basecalls
    assert rows(out / "meth.tsv") == [r for r in expected if r.split("\t")[4] not in lost]


def test_files_written_slowly_in_place_are_read_only_when_complete(fixture_copy, expected, daemons, tmp_path):
    """Done-when 4: every file is appended slowly in place (FAST5 flushed read by read, FASTQ.gz
    flushed record by record, BAM); none is read before it is complete."""
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    d = daemons(tmp_path, live, out)
    assert d.ready.wait(TIMEOUT)
    rep = replay(fixture_copy, live, "--mode", "inplace", "--write-seconds", "0.8", "--interval", "0.3",
                 "--batch-size", "4")
    assert rep.wait(TIMEOUT) == 0
    assert d.wait() == 0, d.output()
    s = summary(out)
    assert s["rejected_files"] == [] and s["records"]["skipped_by_reason"] == {}
    assert (out / "skipped.tsv").read_text().count("\n") == 1
    assert rows(out / "meth.tsv") == expected


@pytest.mark.parametrize("fmt", ["pod5", "blow5"])
def test_pod5_and_blow5_runs_give_the_same_rows(fmt, fixture_copy, expected, daemons, tmp_path):
    """The same reads written as POD5 (pod5_pass/) or BLOW5 signal files: the same calls."""
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    d = daemons(tmp_path, live, out)
    rep = replay(fixture_copy, live, "--speed", "0", "--batch-size", "3", "--signal-format", fmt)
    assert rep.wait(TIMEOUT) == 0
    assert d.wait() == 0, d.output()
    assert summary(out)["files"]["signal_registered"] == 3
    assert rows(out / "meth.tsv") == expected


def skip_reasons(out: Path) -> dict[str, list[str]]:
    by_read: dict[str, list[str]] = {}
    path = out / "skipped.tsv"
    for line in (path.read_text().splitlines()[1:] if path.exists() else []):
        rid, reason = line.split("\t")[:2]
        by_read.setdefault(rid, []).append(reason)
    return by_read


def wait_until(predicate, what: str, d: Daemon) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert d.proc.poll() is None and time.monotonic() < deadline, f"{what}: {d.output()}"
        time.sleep(0.1)


@pytest.mark.parametrize("kill", [False, True])
def test_a_signal_file_landing_after_the_join_timeout_gives_its_calls_once(kill, fixture_copy, expected, daemons,
                                                                          tmp_path):
    """Basecalls land, the join times out, the signal file lands later (a slow copy): the reads
    are called like the others, once, also through a kill -9 at a random point after it lands."""
    staging = tmp_path / "staging"
    subprocess.run(streamer("replay", fixture_copy, staging, "--speed", "0", "--batch-size", "3"),
                   check=True, capture_output=True, timeout=TIMEOUT)
    run = next(staging.iterdir())
    for f in run.glob("final_summary*"):
        f.unlink()
    first = sorted((run / "fast5_pass").iterdir())[0]
    held = Path(shutil.move(first, tmp_path / first.name))
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    run = Path(shutil.move(run, live / run.name))
    flags = ("--follow", "--join-timeout", "2", "-K", "2")
    d = daemons(tmp_path, live, out, *flags)
    late = signal_read_ids(held)
    assert len(late) == 3
    wait_until(lambda: all(skip_reasons(out).get(rid) == ["no signal"] for rid in late), "no signal reported", d)
    shutil.move(held, run / "fast5_pass" / held.name)  # the slow copy lands
    seed = int(os.environ.get("STREAMER_KILL_SEED", random.randrange(1 << 30)))
    if kill:
        time.sleep(random.Random(seed).uniform(0.0, 2.0))
        d.kill()
        d = daemons(tmp_path, live, out, *flags)
    wait_until(lambda: all("recovered" in skip_reasons(out).get(rid, []) for rid in late), "recovered", d)
    (live / "STOP").touch()
    assert d.wait() == 0, d.output()
    assert rows(out / "meth.tsv") == expected, f"seed {seed}"
    reasons = skip_reasons(out)  # a busy machine may let other reads time out too; they recover the same way
    assert set(late) <= set(reasons)
    assert all(r in (["no signal", "recovered"], ["no basecall", "recovered"]) for r in reasons.values()), reasons
    s = summary(out)
    assert s["state"] == "finished" and s["reads"]["done"] == s["reads"]["called"] == 8
    assert s["reads"]["recovered"] == len(reasons) and s["records"]["skipped_by_reason"] == {}
