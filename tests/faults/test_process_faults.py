"""The daemon as a real process, killed: kill -9 at random points and SIGTERM mid-batch, then a restart;
nothing lost or written twice. The stand-in pipeline keeps it to seconds (the same through the real
pipeline is `test_daemon_e2e`); each batch takes a fifth of a second so that kills land mid-batch."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from streamer.daemon.replay import Replayer, ReplayOptions

from conftest import REFERENCE, ROOT
from daemon_support import rows
from test_daemon import N_READS, N_RECORDS, source  # noqa: F401

_CHILD = """
import json, signal, sys, time
sys.path[:0] = sys.argv[2:]
from daemon_support import FakePipeline
from streamer import config
from streamer.daemon.shell import Daemon
from streamer.io.reference import Reference

class Slow(FakePipeline):
    def process(self, reads):
        time.sleep(0.2)
        return super().process(reads)

cfg = config.build(json.loads(sys.argv[1]))
with Reference(cfg.reference.genome) as reference:
    d = Daemon(cfg, Slow(), reference)
    signal.signal(signal.SIGTERM, lambda *_: d.request_stop())
    code = d.run()
    d.close()
print("exit", code, d.state.value, flush=True)
sys.exit(code)
"""


def start(tmp_path: Path) -> subprocess.Popen:
    flat = {"watch.dir": str(tmp_path / "live"), "reference.genome": str(REFERENCE), "output.dir": str(tmp_path / "out"),
            "watch.poll_interval": 0.05, "watch.settle": 0.2, "end.final_summary_grace": 0.2, "batch.max_wait": 0.1,
            "batch.max_reads": 2, "service.status_interval": 0.1, "pipeline.io_mode": "threads",
            "pipeline.compute_threads": 1}  # one batch in the stages at a time: a SIGTERM leaves some waiting
    roots = [str(ROOT / "tests"), str(ROOT / "plugins"), str(ROOT / "gpu"), str(ROOT)]
    return subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(flat), *roots], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def assert_once(out: Path) -> None:
    got = rows(out / "meth.tsv")
    assert len(got) == N_RECORDS == len(set(got))
    s = json.loads((out / "summary.json").read_text())
    assert s["state"] == "finished" and s["reads"]["done"] == s["reads"]["called"] == N_READS


def test_kill_9_at_random_points_then_a_restart_loses_and_repeats_nothing(source, tmp_path):
    Replayer(source, tmp_path / "live", ReplayOptions(speed=0, batch_reads=3)).run()
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kills = []
    for _ in range(3):
        child = start(tmp_path)
        time.sleep(rng.uniform(0.2, 2.0))  # start-up, the journal replay, or a batch
        child.kill()
        child.wait()
        child.stdout.close()
        out = tmp_path / "out" / "meth.tsv"
        kills.append(out.stat().st_size if out.exists() else None)
    child = start(tmp_path)
    assert child.wait(120) == 0, f"seed {seed}, killed at meth.tsv sizes {kills}"
    child.stdout.close()
    assert_once(tmp_path / "out")


def test_sigterm_mid_batch_finishes_it_and_a_restart_does_the_rest(source, tmp_path):
    Replayer(source, tmp_path / "live", ReplayOptions(speed=0, batch_reads=3)).run()
    child = start(tmp_path)
    out = tmp_path / "out"
    deadline = time.monotonic() + 120
    while not (out / "meth.tsv").exists() or len(rows(out / "meth.tsv")) == 0:  # the first batch is committed
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.02)
    time.sleep(0.1)  # into the next batch's fifth of a second
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == 0
    assert child.stdout.read().split() == ["exit", "0", "stopped"]
    child.stdout.close()
    s = json.loads((out / "summary.json").read_text())
    assert s["state"] == "stopped" and 0 < s["reads"]["done"] < N_READS
    child = start(tmp_path)
    assert child.wait(120) == 0
    child.stdout.close()
    assert_once(out)
