"""A new output is a module and its entry point: the JSON-lines sink of tests/plugins, named in
the configuration, is opened by `streamer call --sink` and by the daemon's `output.sinks`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ECOLI, REFERENCE
from daemon_support import FakePipeline, no_leaks, rows  # noqa: F401

from streamer import config, registry
from streamer.daemon.replay import Replayer, ReplayOptions, load_source
from streamer.daemon.shell import Daemon, State
from streamer.io.reference import Reference

PLUGINS = Path(__file__).parent / "plugins"  # jsonl_sink.py and its *.dist-info


@pytest.fixture
def jsonl_plugin(monkeypatch):
    """The test plugin installed in this process (entry points are read from sys.path)."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    registry._group.cache_clear()
    yield
    monkeypatch.undo()
    registry._group.cache_clear()


def calls_of_tsv(path: Path) -> list[tuple]:
    return [(f[4], f[0], f[1], int(f[2]), round(float(f[5]), 2)) for f in (r.split("\t") for r in rows(path))]


def calls_of_jsonl(path: Path) -> list[tuple]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [(c["read"], c["contig"], c["strand"], c["start"], c["llr"]) for c in lines]


def test_call_writes_the_configured_sink(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")  # its index is written beside it
    proc = subprocess.run([sys.executable, "-m", "streamer", "call", "-r", str(tmp_path / "reads.fasta"),
                           "-b", str(ECOLI / "reads.bam"), "-g", str(REFERENCE), "--signal", str(ECOLI / "fast5"),
                           "-o", str(tmp_path / "meth.tsv"), "--sink", "jsonl", "-t", "2"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = calls_of_jsonl(tmp_path / "calls.jsonl")
    assert got and sorted(got) == sorted(calls_of_tsv(tmp_path / "meth.tsv"))


def test_call_names_a_sink_that_is_not_installed(tmp_path):
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    proc = subprocess.run([sys.executable, "-m", "streamer", "call", "-r", str(tmp_path / "reads.fasta"),
                           "-b", str(ECOLI / "reads.bam"), "-g", str(REFERENCE), "--signal", str(ECOLI / "fast5"),
                           "-o", str(tmp_path / "meth.tsv"), "--sink", "jsonl"],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "no streamer.sinks plugin named 'jsonl'" in proc.stderr


def test_the_daemon_writes_the_configured_sink(jsonl_plugin, ecoli, reference_path, tmp_path, no_leaks):
    live = Replayer(load_source(ecoli), tmp_path / "live", ReplayOptions(speed=0, batch_reads=3)).run()
    cfg = config.build({"watch.dir": live, "reference.genome": reference_path, "output.dir": tmp_path / "out",
                        "output.sinks": ["jsonl"], "watch.poll_interval": 0.05, "watch.settle": 0.2,
                        "end.final_summary_grace": 0.2, "batch.max_wait": 0.1, "pipeline.io_mode": "threads"})
    for _ in range(2):  # the restart finds nothing new: the file holds each committed call once
        with Reference(reference_path) as ref:
            d = Daemon(cfg, FakePipeline(), ref)
            try:
                assert d.run() == 0 and d.state is State.FINISHED
            finally:
                d.close()
        got = calls_of_jsonl(cfg.output.dir / "calls.jsonl")
        assert got and sorted(got) == sorted(calls_of_tsv(cfg.output.dir / "meth.tsv"))
