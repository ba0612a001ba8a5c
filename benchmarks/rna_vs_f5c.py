"""Direct RNA eventalign against f5c (1.6 or later) on simulated RNA002 or RNA004 reads.

Writes N reads of random transcripts (`tests/rna_sim.py`: signal 3'->5' at 70 or 130 bases/s, basecalls
with U, mappy alignments) as a BLOW5 with the kit's run metadata, the level table as the text model both
tools read, then runs `f5c eventalign --rna` and `streamer eventalign --rna` (with `--pore rna004` for
RNA004) with each flag set and compares the TSVs byte for byte. It also scores each tool's events
against the truth: the share of rows whose reference position is that of the k-mer the event's samples
were mostly simulated from.

    python benchmarks/rna_vs_f5c.py --f5c PATH/f5c --kit rna002 --work /tmp/rna002 [--reads 40] [--transcripts 6]
        [--model FILE]

Without `--model`: RNA002 takes the shipped 5-mer table, RNA004 the 9-mer table `rna_sim` derives from it.
A model of uncalled4's `.npz` kind (levels normalised, no stdv: uncalled4's RNA004 table) is put in pA
with the shipped RNA002 table's mean and spread and a stdv of 2 pA (`--model` of that kind).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "plugins"), str(ROOT / "gpu")]
from rna_sim import (RNA002_KIT, RNA004_KIT, kmer_truth, make_transcripts, simulate_reads,  # noqa: E402
                     synthetic_rna004_model, write_rna_run, write_text_model)

from streamer.pipeline.chemistry import RNA002_KMER_MODEL  # noqa: E402
from streamer.pore.model import NUCLEOTIDE, PoreModel, builtin_model_path, load_model, logf  # noqa: E402

FLAG_SETS = ([], ["--signal-index", "--scale-events"], ["--samples"], ["--print-read-names", "--signal-index"])
KITS = {"rna002": RNA002_KIT, "rna004": RNA004_KIT}


def model_of(path: Path | None, kit: str) -> PoreModel:
    rna002 = load_model(builtin_model_path(RNA002_KMER_MODEL))
    if path is None:
        return rna002 if kit == "rna002" else synthetic_rna004_model(rna002)
    if path.suffix != ".npz":
        return load_model(path)
    with np.load(path) as z:  # uncalled4's RNA tables: normalised levels
        norm = z["current.mean"].astype(np.float64)
        k = int(z["_k"])
    ref = rna002.level_mean.astype(np.float64)
    mean = ((norm - norm.mean()) / norm.std() * ref.std() + ref.mean()).astype(np.float32)
    stdv = np.full(len(mean), 2.0, np.float32)
    return PoreModel(path.stem, k, NUCLEOTIDE, mean, stdv, logf(stdv))


def truth_share(tsv: Path, reads: dict) -> tuple[int, int]:
    """(rows on the simulated k-mer, rows) of a --print-read-names --signal-index TSV."""
    good = total = 0
    rows: dict[str, list] = {}
    with open(tsv) as fh:
        next(fh)
        for line in fh:
            f = line.split("\t")
            rows.setdefault(f[3], []).append((int(f[1]), int(f[13]), int(f[14])))
    for name, r in rows.items():
        pos, a, b = np.array(r).T
        good += int(np.count_nonzero(kmer_truth(reads[name], a, b) == pos))
        total += len(pos)
    return good, total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--f5c", required=True, type=Path)
    p.add_argument("--kit", choices=tuple(KITS), required=True)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--model", type=Path)
    p.add_argument("--reads", type=int, default=40)
    p.add_argument("--transcripts", type=int, default=6, help="how many transcripts the reads come from")
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args()
    work, kit = args.work, KITS[args.kit]
    rng = np.random.default_rng(args.seed)
    model = model_of(args.model, args.kit)
    transcripts = make_transcripts(rng, args.transcripts)
    reads = simulate_reads(model, transcripts, kit, args.reads, rng)
    write_rna_run(work, kit, reads, transcripts)
    write_text_model(model, work / "model.txt")
    bases = sum(len(r.stretch) for r in reads)
    print(f"{args.kit}: {len(reads)} reads, {bases} bases, model {model.name} (k={model.k})")
    os.environ["PYTHONPATH"] = os.pathsep.join(str(ROOT / d) for d in ("", "plugins", "gpu"))  # this checkout's
    pore = ["--pore", "rna004"] if args.kit == "rna004" else []
    common = ["-r", "reads.fastq", "-b", "reads.bam", "-g", "transcripts.fa", "-t", "2", "--rna", *pore,
              "--kmer-model", "model.txt"]  # fmt: skip
    f5c = str(args.f5c.resolve())
    subprocess.run([f5c, "index", "--slow5", "sim.blow5", "reads.fastq"], cwd=work, check=True, capture_output=True)
    same = True
    by_name = {r.read.record.read_id: r for r in reads}
    for i, flags in enumerate(FLAG_SETS):
        theirs, ours = work / f"f5c.{i}.tsv", work / f"streamer.{i}.tsv"
        with open(theirs, "w") as fh:
            subprocess.run([f5c, "eventalign", *common, "--slow5", "sim.blow5", *flags], cwd=work, check=True,
                           stdout=fh, stderr=subprocess.DEVNULL)  # fmt: skip
        subprocess.run([sys.executable, "-m", "streamer", "eventalign", *common, "--signal", "sim.blow5", "-o",
                        ours.name, *flags], cwd=work, check=True, stderr=subprocess.DEVNULL)  # fmt: skip
        n_rows = sum(1 for _ in open(ours)) - 1
        n_reads = len({line.split("\t")[3] for line in list(open(ours))[1:]})
        equal = filecmp.cmp(theirs, ours, shallow=False)
        same &= equal
        print(f"{' '.join(flags) or '(plain)'}: {n_rows} rows of {n_reads} reads, "
              f"{'identical' if equal else 'DIFFERENT'}")
        if "--print-read-names" in flags:
            for who, tsv in (("f5c", theirs), ("streamer", ours)):
                good, total = truth_share(tsv, by_name)
                print(f"  {who}: {good} of {total} rows ({100 * good / max(total, 1):.2f}%) on the simulated k-mer")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
