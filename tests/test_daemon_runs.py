"""One daemon, several runs: two replayed runs watched by one `streamer run`, each with its own
output folder and ledger, each giving the rows of `streamer call` on its reads."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from conftest import REFERENCE
from daemon_support import rows
from test_daemon_e2e import TIMEOUT, daemons, expected, fixture_copy, replay, summary  # noqa: F401

from streamer.config import load
from streamer.daemon_runs import made_once, run_config, run_folders


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


def test_publishing_several_runs_is_refused_with_one_line(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for r in runs:
        r.mkdir()
    proc = subprocess.run([sys.executable, "-m", "streamer", "run", "--watch", runs[0], "--watch-also", runs[1],
                           "-g", REFERENCE, "-o", tmp_path / "out", "--publish", "tcp://127.0.0.1:5599"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 78, proc.stderr
    assert "publish.endpoint with several runs" in proc.stderr and "Traceback" not in proc.stderr
