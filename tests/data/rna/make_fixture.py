"""Rebuild the simulated direct RNA fixture (run from the repository root) with f5c 1.6's rows for it.

    python tests/data/rna/make_fixture.py PATH/f5c

For each kit (`rna002`, `rna004`) a few reads of random transcripts from `tests/rna_sim.py` (fixed seed):
`sim.blow5` (the kit's run metadata), `reads.fastq` (basecalls with U), `reads.bam` (mappy), `transcripts.fa`,
`truth.npz` (each read's transcript start and the read k-mer each sample came from), and what
`f5c eventalign --rna [--pore rna004] --kmer-model` writes for them, gzipped, with each flag set of
`FLAG_SETS` (TSV, and SAM of both versions), and its `--summary`. RNA002 takes the shipped 5-mer table, RNA004 `synthetic_rna004_model` of it (as the tests do).
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "plugins")]
from rna_sim import (RNA002_KIT, RNA004_KIT, make_transcripts, simulate_reads, synthetic_rna004_model,  # noqa: E402
                     write_rna_run, write_text_model)

from streamer.pipeline.chemistry import RNA002_KMER_MODEL  # noqa: E402
from streamer.pore.model import builtin_model_path, load_model  # noqa: E402

OUT = ROOT / "tests" / "data" / "rna"
FLAG_SETS = {"plain": [], "signal-index.scale-events": ["--signal-index", "--scale-events"], "samples": ["--samples"],
             "sam1": ["--sam", "--sam-out-version", "1"], "sam2": ["--sam", "--sam-out-version", "2"]}
N_READS = 4


def fixture_model(kit: str):
    rna002 = load_model(builtin_model_path(RNA002_KMER_MODEL))
    return rna002 if kit == "rna002" else synthetic_rna004_model(rna002)


def main() -> None:
    f5c = str(Path(sys.argv[1]).resolve())
    for seed, kit in ((5, RNA002_KIT), (6, RNA004_KIT)):
        work = OUT / kit.pore
        rng = np.random.default_rng(seed)
        transcripts = make_transcripts(rng, n=3, lengths=(700, 1400))
        model = fixture_model(kit.pore)
        reads = simulate_reads(model, transcripts, kit, N_READS, rng, lengths=(250, 600))
        write_rna_run(work, kit, reads, transcripts)
        np.savez_compressed(work / "truth.npz", read_id=np.array([p.read.record.read_id for p in reads]),
                            start=np.array([p.start for p in reads]),
                            **{f"kmer{i}": p.read.sample_kmer.astype(np.int16) for i, p in enumerate(reads)})  # fmt: skip
        model_txt = work / "model.txt"
        write_text_model(model, model_txt)
        subprocess.run([f5c, "index", "--slow5", "sim.blow5", "reads.fastq"], cwd=work, check=True, capture_output=True)
        pore = ["--pore", "rna004"] if kit.pore == "rna004" else []
        for name, flags in FLAG_SETS.items():
            out = subprocess.run([f5c, "eventalign", "-r", "reads.fastq", "-b", "reads.bam", "-g", "transcripts.fa",
                                  "--slow5", "sim.blow5", "--rna", *pore, "--kmer-model", "model.txt", "-t", "1",
                                  *flags], cwd=work, check=True, capture_output=True).stdout  # fmt: skip
            ext = "sam" if "--sam" in flags else "tsv"
            with gzip.GzipFile(work / f"eventalign.{name}.f5c-1.6.{ext}.gz", "wb", mtime=0) as fh:
                fh.write(out)
        subprocess.run([f5c, "eventalign", "-r", "reads.fastq", "-b", "reads.bam", "-g", "transcripts.fa", "--slow5",
                        "sim.blow5", "--rna", *pore, "--kmer-model", "model.txt", "-t", "1", "--summary",
                        "eventalign.summary.f5c-1.6.tsv"], cwd=work, check=True, capture_output=True)  # fmt: skip
        for junk in (model_txt, *work.glob("reads.fastq.*"), *work.glob("*.blow5.idx")):
            junk.unlink()


if __name__ == "__main__":
    main()
