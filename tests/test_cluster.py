"""`streamer call --dask`: a LocalCluster of two worker processes writes what a local run writes,
also when a worker dies mid-batch, and a killed client resumes without recomputing what it wrote."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from conftest import ECOLI, REFERENCE

pytest.importorskip("distributed")  # the `cluster` extra (part of `test`)

ARGS = ["-r", str(ECOLI / "reads.fasta"), "-b", str(ECOLI / "reads.bam"), "-g", str(REFERENCE),
        "--signal", str(ECOLI / "fast5"), "-K", "2", "-t", "2"]


def call(*extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamer", "call", *ARGS, *extra], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def local_output(tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("local") / "meth.tsv"
    run = call("-o", str(out))
    assert run.returncode == 0, run.stderr
    return out.read_bytes()


def test_a_local_cluster_writes_what_a_local_run_writes(local_output, tmp_path):
    out = tmp_path / "meth.tsv"
    run = call("-o", str(out), "--dask", "local:2")
    assert run.returncode == 0, run.stderr
    assert out.read_bytes() == local_output and local_output.count(b"\n") > 100
    assert not (tmp_path / "meth.tsv.journal").exists()  # a completed run leaves nothing to resume
    assert "Traceback" not in run.stderr and "distributed" not in run.stderr  # Dask's INFO lines stay quiet


def test_a_worker_killed_mid_batch_loses_nothing(local_output, tmp_path):
    marker = tmp_path / "killed"
    out = tmp_path / "meth.tsv"
    run = call("-o", str(out), "--dask", "local:2", env={"STREAMER_FAULT_KILL_WORKER_ONCE": str(marker)})
    assert run.returncode == 0, run.stderr
    assert marker.exists()  # a worker did die, in the middle of its first batch
    assert out.read_bytes() == local_output


@pytest.mark.parametrize("where", [["--dask", "local:2"], []], ids=["cluster", "here"])
def test_a_killed_client_resumes_without_recomputing(local_output, tmp_path, where):
    out, stats = tmp_path / "meth.tsv", tmp_path / "stats.json"
    killed = call("-o", str(out), *where, env={"STREAMER_FAULT_EXIT_AFTER_BATCHES": "2"})
    assert killed.returncode == 137
    journal = (tmp_path / "meth.tsv.journal").read_text().splitlines()
    assert len(journal) == 3  # the run's identity, then two batches
    resumed = call("-o", str(out), *where, "--resume", "--stats-json", str(stats))
    assert resumed.returncode == 0, resumed.stderr
    assert out.read_bytes() == local_output
    summary = json.loads(stats.read_text())
    written = json.loads(journal[-1])
    assert summary["batches_resumed"] == 2 and "batches resumed:  2" in resumed.stderr
    assert summary["reads_in"] == 9 - 4  # the first two batches of two records were not read again
    assert summary["calls"] + written["calls"] == local_output.count(b"\n") - 1
    assert not (tmp_path / "meth.tsv.journal").exists()


def test_resume_refuses_the_journal_of_another_run(tmp_path):
    out = tmp_path / "meth.tsv"
    assert call("-o", str(out), env={"STREAMER_FAULT_EXIT_AFTER_BATCHES": "1"}).returncode == 137
    other = call("-o", str(out), "--resume", "-K", "3")
    assert other.returncode == 1
    assert other.stderr.strip().splitlines()[-1].endswith(
        "journal of another run (inputs or options differ): remove it, or run without --resume to start over")


def test_dasks_own_lines_are_its_errors_unless_asked_for_more():
    """A busy machine has Dask warn of its event loop, its garbage collection and, as a cluster closes, a worker's
    heartbeat with a traceback: none of it the user's to act on, so by default only Dask's errors reach them."""
    from streamer.cluster import dask_log_level

    levels = [(logging.WARNING, logging.INFO), (logging.WARNING, logging.WARNING), (logging.WARNING, logging.DEBUG),
              (logging.DEBUG, logging.DEBUG)]  # other libraries' and streamer's (`configure_logging`)
    assert [dask_log_level(*pair) for pair in levels] == ["error", "error", "warning", "info"]  # default, -q, -v, -vv
