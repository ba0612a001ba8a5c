"""The daemon on a direct RNA run: the simulated RNA004 fixture replayed as POD5 (`streamer replay
--signal-format pod5`) into the folder `streamer run --eventalign` watches. The pore is told from the
files' run metadata (no `pipeline.pore`), methylation is declined in one line, and eventalign.tsv holds
exactly `streamer eventalign`'s rows on the same files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_support import rows
from rna_sim import synthetic_rna004_model, write_text_model

from streamer.pipeline.chemistry import RNA002_KMER_MODEL, RNA004
from streamer.pore.model import builtin_model_path, load_model
from test_r10_daemon import env_for, replay, streamer

FIXTURE = Path(__file__).parent / "data" / "rna" / "rna004"
TIMEOUT = 600  # a first start on a machine compiles the kernels


@pytest.fixture(scope="module")
def rna004_run(tmp_path_factory) -> Path:
    """The finished run (BLOW5, FASTQ with U, BAM) and a model folder holding the RNA004 9-mer table."""
    tmp = tmp_path_factory.mktemp("rna004daemon")
    run = tmp / "finished"
    run.mkdir()
    for name in ("sim.blow5", "reads.fastq", "reads.bam", "reads.bam.bai"):
        shutil.copy(FIXTURE / name, run / name)
    (tmp / "models" / RNA004.name).mkdir(parents=True)
    write_text_model(synthetic_rna004_model(load_model(builtin_model_path(RNA002_KMER_MODEL))),
                     tmp / "models" / RNA004.name / RNA004.kmer_model.name)  # fmt: skip
    return tmp


def test_replayed_rna004_pod5_run_gives_the_rows_of_streamer_eventalign(rna004_run, tmp_path):
    tmp = rna004_run
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    rep = replay(tmp / "finished", live)
    assert rep.wait(TIMEOUT) == 0, rep.stderr.read().decode()
    assert sorted(live.rglob("*.pod5"))
    genome = FIXTURE / "transcripts.fa"
    log_path = tmp_path / "out.log"
    with open(log_path, "w") as log:
        d = subprocess.run(streamer("run", "--watch", live, "-g", genome, "-o", out, "--model-dir", tmp / "models",
                                    "--settle", "0.3", "--poll-interval", "0.1", "--grace", "1", "--max-wait", "0.2",
                                    "-t", "2", "--disable-cuda", "--eventalign"),
                           stdout=log, stderr=subprocess.STDOUT, env=env_for(tmp), timeout=TIMEOUT)  # fmt: skip
    text = log_path.read_text()
    assert d.returncode == 0, text
    declined = [line for line in text.splitlines() if "methylation calling is not supported for RNA reads" in line]
    assert len(declined) == 1 and "no methylation calls" in declined[0], text
    assert "Traceback" not in text
    offline = subprocess.run(streamer("eventalign", "-r", tmp / "finished" / "reads.fastq", "-b",
                                      tmp / "finished" / "reads.bam", "-g", genome, "--signal", live, "--model-dir",
                                      tmp / "models", "-t", "2", "--disable-cuda", "--rna", "--print-read-names",
                                      "-o", tmp_path / "eventalign.tsv"),
                             capture_output=True, text=True, env=env_for(tmp), timeout=TIMEOUT)  # fmt: skip
    assert offline.returncode == 0, offline.stderr
    want = rows(tmp_path / "eventalign.tsv")
    assert len(want) > 1000 and len({line.split("\t")[3] for line in want}) == 4
    assert rows(out / "eventalign.tsv") == want
    assert rows(out / "meth.tsv") == []
