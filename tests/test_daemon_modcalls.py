"""dorado's modified-base calls in the daemon: the MM/ML tags of the run's basecall BAMs aggregated
live into `modkit.bed`, equal to `streamer pileup` over the same BAMs with the options the daemon
reports, with or without signal files, and through kill -9 and restart (each BAM counted once)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pysam
import pytest

from conftest import ECOLI, REFERENCE

TIMEOUT = 90


def streamer(*args) -> list[str]:
    return [sys.executable, "-m", "streamer", *map(str, args)]


@pytest.fixture(scope="module")
def modbam(tmp_path_factory) -> Path:
    """A modBAM of the fixture's reads: `streamer call --modbam` (MM/ML tags as dorado writes them)."""
    d = tmp_path_factory.mktemp("call")
    subprocess.run(streamer("call", "-r", ECOLI / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE,
                            "--signal", ECOLI / "fast5", "-o", d / "meth.tsv", "--modbam", d / "mod.bam"),
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    return d / "mod.bam"


def finished_run(tmp_path: Path, modbam: Path) -> Path:
    run = tmp_path / "finished"
    shutil.copytree(ECOLI / "fast5", run / "fast5")
    shutil.copy(ECOLI / "reads.fasta", run)
    shutil.copy(modbam, run / "reads.bam")
    return run


def daemon_flags(live: Path, out: Path, *extra) -> list:
    return ["--watch", live, "-g", REFERENCE, "-o", out, "--settle", "0.3", "--poll-interval", "0.1", "--grace", "1",
            "--max-wait", "0.2", "-K", "1", *extra]


def pileup(bams: list[Path], options: str, out: Path) -> str:
    subprocess.run(streamer("pileup", *bams, "--ref", REFERENCE, *options.split(), "-o", out), check=True,
                   capture_output=True, timeout=300)
    return out.read_text()


def check_table(out: Path, live: Path, tmp_path: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())["modcalls"]
    bams = sorted(live.rglob("*.bam"))
    want = pileup(bams, summary["pileup_options"], tmp_path / "offline.bed")
    assert want.count("\n") > 100
    assert (out / "modkit.bed").read_text() == want
    assert summary["files"] == len(bams) and summary["unreadable_files"] == 0
    return summary


def test_live_table_equals_streamer_pileup_with_the_estimated_threshold(modbam, tmp_path):
    run = finished_run(tmp_path, modbam)
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    rep = subprocess.run(streamer("replay", run, live, "--interval", "0", "--batch-size", "3"), timeout=TIMEOUT,
                         capture_output=True)
    assert rep.returncode == 0
    proc = subprocess.run(streamer("run", *daemon_flags(live, out)), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    summary = check_table(out, live, tmp_path)
    assert summary["pileup_options"].startswith("--cpg --filter-threshold 0.0 --filter-threshold C:")
    assert len([line for line in proc.stderr.splitlines() if "pass thresholds estimated" in line]) == 1


def test_without_signal_files_and_with_fixed_options(modbam, tmp_path):
    """Only `bam_pass/` (no signal): the calls are counted all the same; options as configured."""
    live, out = tmp_path / "live", tmp_path / "out"
    (live / "bam_pass").mkdir(parents=True)
    with pysam.AlignmentFile(str(modbam), "rb") as src:
        records = list(src.fetch(until_eof=True))
        for i in range(0, len(records), 3):
            with pysam.AlignmentFile(str(live / "bam_pass" / f"batch_{i}.bam"), "wb", header=src.header) as dst:
                for rec in records[i:i + 3]:
                    dst.write(rec)
    (live / "final_summary_x.txt").write_text("done\n")
    proc = subprocess.run(streamer("run", *daemon_flags(live, out, "--mod-filter-threshold", "0.6",
                                                        "--mod-combine-strands")),
                          capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = check_table(out, live, tmp_path)
    assert summary["pileup_options"] == "--cpg --combine-strands --filter-threshold 0.6"


def test_kill_9_and_restart_count_each_bam_once(modbam, tmp_path):
    seed = int(os.environ.get("STREAMER_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    run = finished_run(tmp_path, modbam)
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    rep = subprocess.Popen(streamer("replay", run, live, "--interval", "0.5", "--batch-size", "1"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = open(tmp_path / "daemon.log", "w+")
    procs = [rep]
    try:
        for _ in range(4):
            proc = subprocess.Popen(streamer("run", *daemon_flags(live, out)), stdout=log, stderr=subprocess.STDOUT)
            procs.append(proc)
            deadline = time.monotonic() + TIMEOUT
            while not (out / ".streamer" / "ledger.sqlite").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 2.0))
            if proc.poll() is not None:
                break
            proc.kill()
            proc.wait()
        assert rep.wait(TIMEOUT) == 0
        proc = subprocess.Popen(streamer("run", *daemon_flags(live, out)), stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        assert proc.wait(TIMEOUT * 2) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.seek(0)
        text = log.read()
        log.close()
    assert "Traceback" not in text
    check_table(out, live, tmp_path)
    assert text.count("pass thresholds estimated") == 1, f"seed {seed}"
