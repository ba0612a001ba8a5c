"""R10.4.1 eventalign against f5c (1.2 or later) on reads simulated from the 9-mer level table.

Writes N reads of random E. coli stretches (both strands, random dwell shape, shift and scale)
as an R10.4.1 BLOW5 with their sequences as basecalls and an exact BAM, the level table as the
text model f5c reads (`#k 9`, the same float32 values), then runs `streamer eventalign` and
`f5c eventalign --slow5` with each flag set and compares the TSVs byte for byte.

    python benchmarks/r10_vs_f5c.py --f5c PATH/f5c --model ../shared/models/r10/dna_r10.4.1_400bps_9mer.npz \
        --genome ecoli.fa --work /tmp/r10cmp [--reads 24]

`--genome` must be a plain FASTA with a `.fai` (f5c reads it through faidx).
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
from r10_sim import Placed, reverse_complement, simulate, write_run, write_text_model  # noqa: E402

from streamer.io.reference import Reference  # noqa: E402
from streamer.pore.model import load_model  # noqa: E402

FLAG_SETS = ([], ["--print-read-names", "--signal-index"], ["--scale-events", "--samples"])


def write_inputs(work: Path, model_path: Path, genome: Path, n_reads: int, seed: int) -> tuple[int, int]:
    model = load_model(model_path)
    rng = np.random.default_rng(seed)
    reads = []
    with Reference(genome) as ref:
        contig = ref.names[0]
        length = ref.length(contig)
        while len(reads) < n_reads:
            n = int(rng.integers(500, 6000))
            start, rc = int(rng.integers(0, length - n)), bool(rng.integers(2))
            stretch = ref.fetch(contig, start, start + n)
            if set(stretch) - set("ACGT"):
                continue
            sim = simulate(model, reverse_complement(stretch) if rc else stretch, rng, shift=float(rng.normal(0, 8)),
                           scale=float(rng.uniform(0.9, 1.15)), dwell_shape=float(rng.uniform(1.2, 4.0)))  # fmt: skip
            reads.append(Placed(sim, start, rc, stretch))
    write_run(work, reads, contig, length)
    write_text_model(model, work / "model.txt")  # shortest decimals that read back as the same float32
    return len(reads), sum(len(r.stretch) for r in reads)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--f5c", required=True, type=Path)
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--genome", required=True, type=Path)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--reads", type=int, default=24)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    n, bases = write_inputs(work, args.model, args.genome, args.reads, args.seed)
    print(f"{n} reads, {bases} bases")
    os.environ["PYTHONPATH"] = os.pathsep.join(str(ROOT / d) for d in ("", "plugins", "gpu"))  # this checkout's
    common = ["-r", "reads.fasta", "-b", "reads.bam", "-g", str(args.genome.resolve()), "-t", "2"]
    subprocess.run([str(args.f5c.resolve()), "index", "--slow5", "sim.blow5", "reads.fasta"], cwd=work, check=True,
                   capture_output=True)  # fmt: skip
    same = True
    for i, flags in enumerate(FLAG_SETS):
        theirs, ours = work / f"f5c.{i}.tsv", work / f"streamer.{i}.tsv"
        with open(theirs, "w") as fh:
            subprocess.run([str(args.f5c.resolve()), "eventalign", *common, "--slow5", "sim.blow5", "--kmer-model",
                            "model.txt", *flags], cwd=work, check=True, stdout=fh, stderr=subprocess.DEVNULL)  # fmt: skip
        subprocess.run([sys.executable, "-m", "streamer", "eventalign", *common, "--signal", "sim.blow5", "--kmer-model",
                        str(args.model.resolve()), "-o", ours.name, *flags], cwd=work, check=True,
                       stderr=subprocess.DEVNULL)  # fmt: skip
        rows = sum(1 for _ in open(ours)) - 1
        equal = filecmp.cmp(theirs, ours, shallow=False)
        same &= equal
        print(f"{' '.join(flags) or '(default)'}: {rows} rows, {'identical' if equal else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
