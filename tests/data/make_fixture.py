"""Rebuild the small E. coli fixture from ../shared (run from the repository root).

Keeps a handful of reads (both strands, short and long, the f5c read-level test
read) with their FAST5 files, basecalls, alignments and the expected nanopolish /
f5c rows, so the suite runs on a fresh machine without ../shared.
"""

import shutil
import sys
from pathlib import Path

import h5py
import pysam

SHARED = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/ecoli_2kb_region")
OUT = Path("tests/data/ecoli")
READS = [
    "fa9ad683-35c5-4dad-a3af-de7a86b1ffa8",
    "c75c8f96",
    "2c469631",
    "b098b785",
    "280af896",
    "912e1555",
    "0a238451",
    "71408c92",
]


def main() -> None:
    wanted = {}
    for f5 in sorted((SHARED / "fast5_files").glob("*.fast5")):
        with h5py.File(f5) as h:
            for grp in h["Raw/Reads"].values():
                rid = grp.attrs["read_id"].decode()
                if any(rid.startswith(p) for p in READS):
                    wanted[rid] = f5
    assert len(wanted) == len(READS), wanted
    (OUT / "fast5").mkdir(parents=True, exist_ok=True)
    for f5 in wanted.values():
        shutil.copy(f5, OUT / "fast5" / f5.name)
    with open(SHARED / "reads.fasta") as fin, open(OUT / "reads.fasta", "w") as fout:
        keep = False
        for line in fin:
            if line.startswith(">"):
                keep = line[1:].split()[0] in wanted
            if keep:
                fout.write(line)
    with pysam.AlignmentFile(SHARED / "reads.mg1655.sorted.bam") as bam_in:
        with pysam.AlignmentFile(OUT / "reads.bam", "wb", template=bam_in) as bam_out:
            for rec in bam_in:
                if rec.query_name in wanted:
                    bam_out.write(rec)
    pysam.index(str(OUT / "reads.bam"))
    for tool in ("nanopolish-0.14", "f5c-1.1"):
        with open(SHARED / "expected" / tool / "meth.tsv") as fin, open(OUT / f"meth.{tool}.tsv", "w") as fout:
            fout.write(fin.readline())
            fout.writelines(l for l in fin if l.split("\t")[4] in wanted)
    level = SHARED / "expected" / "f5c-1.1-read-level"
    for name in ("read1.events.exp", "read1.scalings.exp", "adaptive.exp"):
        shutil.copy(level / name, OUT / name)
    with open(level / "recalibrated_scalings.tsv") as fin, open(OUT / "recalibrated_scalings.tsv", "w") as fout:
        fout.write(fin.readline())
        fout.writelines(l for l in fin if l.split("\t")[0] in wanted)
    shutil.copy(SHARED / "LICENSE.f5c", OUT / "LICENSE.f5c")
    shutil.copy(SHARED.parent / "reference" / "ecoli_k12_mg1655.fa.gz", OUT.parent / "ecoli_k12_mg1655.fa.gz")


if __name__ == "__main__":
    main()
