"""The daemon on R10.4.1 runs: a simulated run replayed as POD5 (`streamer replay --signal-format
pod5`) into a folder `streamer run` watches gives exactly `streamer call`'s rows on the same reads,
the pore told from the files' run metadata (no `pipeline.pore`); without the CpG model the daemon
says which file is missing and where f5c publishes it, and still writes eventalign."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import REFERENCE
from daemon_support import rows
from r10_sim import R10_RUN, Placed, simulate_methylated, synthetic_cpg_model, write_run, write_text_model

from streamer.pipeline.batch import ReadInput
from streamer.errors import InputError, StreamerError
from streamer.io.signal_record import SignalRecord
from streamer.io.reference import Reference
from streamer.io.signal import iter_signal
from streamer.io.slow5 import write_blow5
from streamer.daemon.pore_pipeline import PorePipeline, first_signal_file
from streamer.pipeline import chemistry
from streamer.pipeline.chemistry import F5C_RELEASES, pore_of_file
from streamer.pore.model import load_model
from streamer.daemon.replay import Replayer, ReplayOptions, load_source

CONTIG = "NC_000913.3"
R10_MODEL = Path(__file__).resolve().parents[2] / "shared" / "models" / "r10" / "dna_r10.4.1_400bps_9mer.npz"
READS = ((150_000, False), (420_000, True), (1_700_000, False), (3_100_000, True), (2_200_000, True))
READ_LEN = 2500
TIMEOUT = 600  # the first start on a machine compiles the 9-mer kernels

R9, R10 = chemistry.R9.name, chemistry.R10.name
R10_KMER_MODEL, R10_METH_MODEL = chemistry.R10.kmer_model.name, chemistry.R10.meth_model.name


@pytest.fixture(scope="module")
def r10_run(tmp_path_factory):
    """A finished R10.4.1 run (BLOW5, FASTA, BAM) of five simulated reads on both strands, and a model
    folder with the 9-mer table and the synthetic CpG 9-mer model; a second folder lacks the CpG model."""
    if not R10_MODEL.is_file():
        pytest.skip("../shared R10 model not present")
    tmp = tmp_path_factory.mktemp("r10daemon")
    kmer = load_model(R10_MODEL)
    meth = synthetic_cpg_model(kmer)
    for name, with_cpg in (("models", True), ("no-cpg", False)):
        (tmp / name / "r10").mkdir(parents=True)
        (tmp / name / "r10" / R10_KMER_MODEL).symlink_to(R10_MODEL)
        if with_cpg:
            write_text_model(meth, tmp / name / "r10" / R10_METH_MODEL)
    rng = np.random.default_rng(13)
    run = tmp / "finished"
    run.mkdir()
    with Reference(REFERENCE) as ref:
        placed = []
        for start, rc in READS:
            stretch = ref.fetch(CONTIG, start, start + READ_LEN)
            sim = simulate_methylated(kmer, meth, stretch, rc, 0.5, rng, shift=float(rng.normal(0, 5)),
                                      scale=float(rng.uniform(0.95, 1.1)))  # fmt: skip
            placed.append(Placed(sim.read, start, rc, stretch))
        write_run(run, placed, CONTIG, ref.length(CONTIG))
    return tmp


def env_for(tmp: Path) -> dict[str, str]:
    return {**os.environ, "STREAMER_MODEL_CACHE_DIR": str(tmp / "cache"), "STREAMER_MODEL_DIR": str(tmp / "none"),
            "STREAMER_SLOW5_INDEX_DIR": str(tmp / "slow5-index")}


def streamer(*args) -> list[str]:
    return [sys.executable, "-m", "streamer", *map(str, args)]


def replay(run: Path, live: Path) -> subprocess.Popen:
    return subprocess.Popen(streamer("replay", run, live, "--signal-format", "pod5", "--interval", "0.5",
                                     "--batch-size", "2"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def daemon(tmp: Path, live: Path, out: Path, models: Path, *flags: str) -> subprocess.Popen:
    log = open(out.parent / f"{out.name}.log", "w")
    return subprocess.Popen(streamer("run", "--watch", live, "-g", REFERENCE, "-o", out, "--model-dir", models,
                                     "--settle", "0.3", "--poll-interval", "0.1", "--grace", "1", "--max-wait", "0.2",
                                     "-t", "2", "--disable-cuda", *flags),
                            stdout=log, stderr=subprocess.STDOUT, env=env_for(tmp))  # fmt: skip


def offline(tmp: Path, command: str, live: Path, models: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """`streamer call`/`eventalign` on the replayed run's own files: its POD5s and the source basecalls."""
    run = tmp / "finished"
    return subprocess.run(streamer(command, "-r", run / "reads.fasta", "-b", run / "reads.bam", "-g", REFERENCE,
                                   "--signal", live, "--model-dir", models, "-t", "2", "--disable-cuda", "-o", out,
                                   *flags),
                          capture_output=True, text=True, env=env_for(tmp), timeout=TIMEOUT)  # fmt: skip


def test_replayed_r10_pod5_run_gives_the_rows_of_streamer_call(r10_run, tmp_path):
    """The daemon starts before the run has a file (so on the default pore), and takes R10.4.1 from
    the first POD5's run metadata."""
    tmp = r10_run
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    d = daemon(tmp, live, out, tmp / "models")
    deadline = time.monotonic() + TIMEOUT
    while "watching" not in (tmp_path / "out.log").read_text():  # warm on the default pore, the folder empty
        assert d.poll() is None and time.monotonic() < deadline, (tmp_path / "out.log").read_text()
        time.sleep(0.2)
    rep = replay(tmp / "finished", live)
    assert rep.wait(TIMEOUT) == 0, rep.stderr.read().decode()
    assert d.wait(TIMEOUT) == 0, (tmp_path / "out.log").read_text()
    pod5s = sorted(live.rglob("*.pod5"))
    assert len(pod5s) == 3
    log = (tmp_path / "out.log").read_text()
    assert f"{pod5s[0]}: the run is R10.4.1: loading its models" in log
    call = offline(tmp, "call", live, tmp / "models", tmp_path / "call.tsv")
    assert call.returncode == 0, call.stderr
    want = rows(tmp_path / "call.tsv")
    assert len(want) > 150 and {line.split("\t")[1] for line in want} == {"+", "-"}
    assert rows(out / "meth.tsv") == want


def test_r10_run_without_the_cpg_model_still_gets_eventalign(r10_run, tmp_path):
    """The run is there before the daemon starts (the pore is told at start); the missing CpG model is
    named in one line with where f5c publishes it, and eventalign.tsv is `streamer eventalign`'s."""
    tmp = r10_run
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    assert replay(tmp / "finished", live).wait(TIMEOUT) == 0
    d = daemon(tmp, live, out, tmp / "no-cpg", "--eventalign")
    assert d.wait(TIMEOUT) == 0, (tmp_path / "out.log").read_text()
    log = (tmp_path / "out.log").read_text()
    missing = tmp / "no-cpg" / "r10" / R10_METH_MODEL
    lines = [line for line in log.splitlines() if R10_METH_MODEL in line]
    assert len(lines) == 1 and str(missing) in lines[0] and F5C_RELEASES in lines[0], log
    assert "no methylation calls" in lines[0]
    assert rows(out / "meth.tsv") == []
    ea = offline(tmp, "eventalign", live, tmp / "no-cpg", tmp_path / "eventalign.tsv", "--print-read-names")
    assert ea.returncode == 0, ea.stderr
    want = rows(tmp_path / "eventalign.tsv")
    assert len(want) > 5 * READ_LEN
    assert rows(out / "eventalign.tsv") == want
    # streamer call without the CpG model keeps its one-line error
    call = offline(tmp, "call", live, tmp / "no-cpg", tmp_path / "call.tsv")
    assert call.returncode != 0 and call.stderr.count("\n") == 1 and str(missing) in call.stderr


# --- the pore from the files, without models or kernels ------------------------------------------


def small_run(tmp: Path, rate: float, run_info: dict[str, str] | None) -> Path:
    """A finished run of three short random-signal reads at `rate` Hz, as BLOW5 with that run metadata."""
    rng = np.random.default_rng(3)
    recs = [SignalRecord(str(uuid.UUID(bytes=rng.bytes(16), version=4)), rng.integers(400, 600, n).astype(np.int16),
                         2048.0, -285.0, 383.12, rate) for n in (1000, 4000, 2500)]  # fmt: skip
    tmp.mkdir()
    write_blow5(tmp / "run.blow5", recs, header=run_info)
    (tmp / "reads.fasta").write_text("".join(f">{r.read_id}\nACGT\n" for r in recs))
    return tmp


@pytest.mark.parametrize("rate", [4000.0, 5000.0])
def test_replay_of_a_blow5_run_keeps_its_reads_and_pore(tmp_path, rate):
    """R10.4.1 runs at 4 and 5 kHz: replayed as POD5, each file tells the pore, each read its rate."""
    src = load_source(small_run(tmp_path / "run", rate, R10_RUN))
    assert [round(r.end_s - r.start_s, 6) for r in src.reads] == [n / rate for n in (1000, 4000, 2500)]
    assert src.reads[1].start_s == src.reads[0].end_s and src.run_info == R10_RUN
    live = Replayer(src, tmp_path / "live", ReplayOptions(speed=0, batch_reads=2, signal_format="pod5")).run()
    pod5s = sorted(live.rglob("*.pod5"))
    assert len(pod5s) == 2 and {pore_of_file(p) for p in pod5s} == {R10}
    got = [r for p in pod5s for r in iter_signal(p)]
    assert [r.read_id for r in got] == [r.read_id for r in src.reads] and {r.sample_rate for r in got} == {rate}
    assert first_signal_file(tmp_path / "live") == pod5s[0]
    with pytest.raises(InputError, match="not FAST5"):
        Replayer(src, tmp_path / "live2", ReplayOptions(signal_format="fast5"))


class Built:
    """Stands in for a warm pipeline: says which pore it was built for."""

    gpu = None

    def __init__(self, pore, source):
        self.pore, self.source = pore, source

    def process(self, reads):
        return self.pore

    def front(self, batch):
        batch.ran[self.pore] = 0.0

    def run_batch(self, batch):
        return self.pore, dict(batch.ran)


def test_pore_pipeline_follows_the_files(tmp_path):
    r10 = small_run(tmp_path / "r10", 4000.0, R10_RUN) / "run.blow5"
    bare = small_run(tmp_path / "bare", 5000.0, None) / "run.blow5"
    r9 = small_run(tmp_path / "r9", 4000.0, {"flow_cell_product_code": "FLO-MIN106"}) / "run.blow5"
    built = []

    def make(pore, source, cuda):
        built.append(Built(pore, source))
        return built[-1]

    def reads(*paths):
        return [ReadInput("r", "", None, "c", 0, 1, False, None, "", signal_path=str(p)) for p in paths]

    auto = PorePipeline(make, None, "", follow=True)
    assert auto.process(reads(bare)) is None and len(built) == 1  # metadata says nothing: as it was
    assert auto.process(reads(r10, bare)) == R10 and built[-1].source == f"{r10}'s run metadata"
    assert auto.process(reads(r10)) == R10 and len(built) == 2  # built once per pore
    with pytest.raises(StreamerError, match="pores r10 and r9"):
        auto.process(reads(r10, r9))
    assert auto.process(reads(r9)) == R9 and len(built) == 3
    default = PorePipeline(make, None, "", follow=True)  # built before any file: the default pore's (R9.4.1)
    assert default.process(reads(r9)) is None and len(built) == 4 and default.pore == R9  # named: not built again
    fixed = PorePipeline(make, R9, "pipeline.pore r9", follow=False)
    assert fixed.process(reads(r10)) == R9


def test_pore_pipeline_runs_a_batch_ahead_only_on_its_own_pores_pipeline(tmp_path):
    """The driver's front thread runs ahead of the compute threads: a batch's front stages go only where it
    is sure to compute on a pipeline of that pore (its files name the current pore, or the pore is fixed)."""
    from types import SimpleNamespace

    r10 = small_run(tmp_path / "r10", 4000.0, R10_RUN) / "run.blow5"
    bare = small_run(tmp_path / "bare", 5000.0, None) / "run.blow5"
    r9 = small_run(tmp_path / "r9", 4000.0, {"flow_cell_product_code": "FLO-MIN106"}) / "run.blow5"

    def batch(*paths):
        return SimpleNamespace(signal_paths=[str(p) for p in paths], ran={})

    auto = PorePipeline(lambda pore, source, cuda: Built(pore, source), R10, "", follow=True)
    b = batch(r10)
    auto.front(b)
    assert auto.run_batch(b) == (R10, {R10: 0.0})  # run ahead, then the rest on the same pore's pipeline
    for other in (batch(r9), batch(bare)):  # another pore, or files that do not say: all at compute time
        auto.front(other)
        assert other.ran == {}
    assert auto.run_batch(batch(r9)) == (R9, {})
    ahead = batch(r10)
    auto.front(ahead)  # r9's pipeline is current: r10's batch is not run ahead
    assert ahead.ran == {} and auto.run_batch(ahead) == (R10, {})
    fixed = PorePipeline(lambda pore, source, cuda: Built(pore, source), R9, "pipeline.pore r9", follow=False)
    b = batch(r10)
    fixed.front(b)
    assert fixed.run_batch(b) == (R9, {R9: 0.0})
