"""Direct RNA (RNA002, RNA004) as f5c 1.6 aligns it: on the simulated fixture of tests/data/rna,
`streamer eventalign --rna` writes f5c's rows byte for byte (plain, `--signal-index --scale-events`,
`--samples`; `--sam` of both versions; `--summary`), its events land on the k-mers they were simulated
from at least as often as f5c's, the pore is told from BLOW5 and POD5 run metadata, the GPU writes the
CPU's rows, and methylation calling on RNA stops with one line."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pysam
import pytest
from rna_sim import synthetic_rna004_model, write_text_model

from streamer.cli import main
from streamer.io.pod5 import write_pod5
from streamer.io.poretype import run_metadata
from streamer.io.signal import iter_signal
from streamer.pipeline.chemistry import RNA002_KMER_MODEL, pore_of_file
from streamer.pore.model import builtin_model_path, load_model
from test_gpu_abea import run_cases

DATA = Path(__file__).parent / "data" / "rna"
KITS = {"rna002": [], "rna004": ["--pore", "rna004"]}
FLAG_SETS = {"plain": [], "signal-index.scale-events": ["--signal-index", "--scale-events"], "samples": ["--samples"],
             "sam1": ["--sam", "--sam-out-version", "1"], "sam2": ["--sam", "--sam-out-version", "2"]}
GPU_CASES = Path(__file__).parent / "gpu_rna_cases.py"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The fixture's text models: the shipped RNA002 5-mer table, and the 9-mer table derived from it."""
    path = tmp_path_factory.mktemp("rna-models") / "rna004.model"
    write_text_model(synthetic_rna004_model(load_model(builtin_model_path(RNA002_KMER_MODEL))), path)
    return {"rna002": builtin_model_path(RNA002_KMER_MODEL), "rna004": path}


@pytest.fixture(autouse=True)
def _private_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMER_SLOW5_INDEX_DIR", str(tmp_path / "slow5-index"))
    monkeypatch.setenv("STREAMER_MODEL_CACHE_DIR", str(tmp_path / "model-cache"))


def eventalign(kit: str, out: Path, *flags, signal: Path | None = None, reads: Path | None = None) -> int:
    work = DATA / kit
    return main(["eventalign", "-r", str(reads or work / "reads.fastq"), "-b", str(work / "reads.bam"), "-g",
                 str(work / "transcripts.fa"), "--signal", str(signal or work / "sim.blow5"), "-t", "2", "-o", str(out),
                 *map(str, flags)])  # fmt: skip


def f5c_rows(kit: str, name: str) -> str:
    ext = "sam" if "--sam" in FLAG_SETS[name] else "tsv"
    with gzip.open(DATA / kit / f"eventalign.{name}.f5c-1.6.{ext}.gz", "rt") as fh:
        return fh.read()


@pytest.mark.parametrize("name", list(FLAG_SETS))
@pytest.mark.parametrize("kit", list(KITS))
def test_rna_eventalign_is_f5c_16s_byte_for_byte(kit, name, models, tmp_path):
    out = tmp_path / "ea.tsv"
    assert eventalign(kit, out, "--rna", *KITS[kit], "--kmer-model", models[kit], *FLAG_SETS[name]) == 0
    want = f5c_rows(kit, name)
    assert want.count("\n") > (5 if "--sam" in FLAG_SETS[name] else 1000)
    assert out.read_text() == want


def truth_share(kit: str, tsv: str) -> float:
    """The share of a `--signal-index` TSV's rows on the transcript position of the k-mer their event's samples
    were mostly simulated from (`tests/rna_sim.py`'s truth, kept in truth.npz)."""
    with np.load(DATA / kit / "truth.npz") as z:
        truth = {str(rid): (int(start), z[f"kmer{i}"]) for i, (rid, start) in enumerate(zip(z["read_id"], z["start"]))}
    with pysam.AlignmentFile(str(DATA / kit / "reads.bam")) as bam:
        names = [rec.query_name for rec in bam]
    lines = tsv.splitlines()
    cols = lines[0].split("\t")
    at = {c: cols.index(c) for c in ("position", "start_idx", "end_idx")}
    label = cols.index("read_name") if "read_name" in cols else cols.index("read_index")
    right = 0
    for line in lines[1:]:
        f = line.split("\t")
        name = f[label] if cols[label] == "read_name" else names[int(f[label])]
        start, kmer = truth[name]
        ki = np.bincount(kmer[int(f[at["start_idx"]]) : int(f[at["end_idx"]])]).argmax()
        right += int(f[at["position"]]) == start + ki
    return right / (len(lines) - 1)


@pytest.mark.parametrize("kit", list(KITS))
def test_rna_events_land_on_their_kmers_as_often_as_f5cs(kit, models, tmp_path):
    out = tmp_path / "ea.tsv"
    assert eventalign(kit, out, "--rna", *KITS[kit], "--kmer-model", models[kit], "--print-read-names",
                      "--signal-index") == 0  # fmt: skip
    ours, theirs = truth_share(kit, out.read_text()), truth_share(kit, f5c_rows(kit, "signal-index.scale-events"))
    assert ours >= theirs >= 0.75, (ours, theirs)


def test_rna004_told_from_blow5_and_pod5_run_metadata(models, tmp_path):
    """Without --pore, the BLOW5's kit names RNA004 (with or without --rna); the same reads as POD5 too."""
    blow5 = DATA / "rna004" / "sim.blow5"
    assert pore_of_file(blow5) == "rna004" and pore_of_file(DATA / "rna002" / "sim.blow5") == "rna002"
    pod5 = tmp_path / "sim.pod5"
    write_pod5(pod5, iter_signal(blow5), run=run_metadata(blow5))
    assert pore_of_file(pod5) == "rna004"
    want = f5c_rows("rna004", "plain")
    for i, (flags, signal) in enumerate((([], blow5), (["--rna"], blow5), ([], pod5))):
        out = tmp_path / f"ea{i}.tsv"
        assert eventalign("rna004", out, *flags, "--kmer-model", models["rna004"], signal=signal) == 0
        assert out.read_text() == want, (flags, signal)


@pytest.mark.parametrize("kit", list(KITS))
def test_rna_summary_is_f5c_16s(kit, models, tmp_path):
    """model_name rna, and the BLOW5 named `slow5` as f5c 1.6 names it (`--compat f5c`, the default)."""
    summary = tmp_path / "summary.tsv"
    assert eventalign(kit, tmp_path / "ea.tsv", "--rna", *KITS[kit], "--kmer-model", models[kit], "--summary",
                      summary) == 0  # fmt: skip
    want = (DATA / kit / "eventalign.summary.f5c-1.6.tsv").read_text()
    assert want.count("\tslow5\trna\ttemplate\t") == 4 and summary.read_text() == want
    assert eventalign(kit, tmp_path / "ea.tsv", "--rna", *KITS[kit], "--kmer-model", models[kit], "--summary",
                      summary, "--compat", "nanopolish") == 0  # fmt: skip
    assert "\tslow5\t" not in summary.read_text() and "sim.blow5\trna\t" in summary.read_text()


def test_rna_basecalls_with_u_or_t_are_the_same(tmp_path):
    """Basecalls are read U as T (the fixture's are written with U)."""
    as_t = tmp_path / "reads.fastq"
    as_t.write_text((DATA / "rna002" / "reads.fastq").read_text().replace("U", "T"))
    assert "U" in (DATA / "rna002" / "reads.fastq").read_text().split("\n")[1]
    assert eventalign("rna002", tmp_path / "ea.tsv", "--rna", reads=as_t) == 0  # the shipped 5-mer table
    assert (tmp_path / "ea.tsv").read_text() == f5c_rows("rna002", "plain")


def test_rna_refusals_are_one_line(tmp_path, capsys):
    work = DATA / "rna002"
    code = main(["call", "-r", str(work / "reads.fastq"), "-b", str(work / "reads.bam"), "-g",
                 str(work / "transcripts.fa"), "--signal", str(work / "sim.blow5"), "-o", str(tmp_path / "m.tsv")])
    err = capsys.readouterr().err
    assert code == 1 and "methylation calling is not supported for RNA reads" in err and "Traceback" not in err
    assert err.strip().count("\n") == 0, err
    assert eventalign("rna002", tmp_path / "ea.tsv", "--rna", "--pore", "r10") == 2
    err = capsys.readouterr().err
    assert "--rna: R10.4.1 has no direct RNA kit; RNA004 reads take --pore rna004" in err, err


def test_u_in_a_text_model_is_read_as_t(tmp_path):
    """f5c's RNA004 5-mer test table writes its k-mers over U: it loads as the same table over T."""
    text = (builtin_model_path(RNA002_KMER_MODEL)).read_text()
    over_u = tmp_path / "u.model"
    over_u.write_text("".join(line if line.startswith(("#", "kmer")) else line[:5].replace("T", "U") + line[5:]
                              for line in text.splitlines(keepends=True)))  # fmt: skip
    assert "AAAAU\t" in over_u.read_text()
    a, b = load_model(over_u), load_model(builtin_model_path(RNA002_KMER_MODEL))
    assert a.k == b.k == 5 and np.array_equal(a.level_mean, b.level_mean) and np.array_equal(a.level_stdv, b.level_stdv)


@pytest.mark.parametrize("target", ["simulator", "gpu"])
def test_rna_eventalign_on_the_gpu_is_the_cpus(target):
    """Event detection with RNA's windows and ABEA on the GPU, the events turned round between them."""
    cases = run_cases(target, GPU_CASES)
    for kit in KITS:
        cpu, gpu = cases[f"{kit}_cpu"], cases[f"{kit}_gpu"]
        assert cpu.count("\n") > 200 and gpu == cpu
        abea = cases[f"{kit}_gpu_abea"]
        assert abea["n_gpu"] == abea["n_reads"] > 0 and abea["fallback"] == "" and cases[f"{kit}_gpu_events_on_gpu"]
        assert cases[f"{kit}_cpu_abea"] is None
