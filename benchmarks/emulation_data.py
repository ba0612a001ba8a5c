"""The replay data of `jetson_emulation.py`: five flow cells' runs, staged once, and the same reads as one input.

Each flow cell's reads are copies of the shared E. coli reads under fresh read ids (`common.new_id`;
copies never repeat across cells), written as a finished run (one POD5, the basecalls as FASTA, the
aligned BAM) and then staged by `streamer replay --stage-only` into batch files of `file_reads`
reads (POD5, FASTQ and BAM per batch, as MinKNOW writes them; with `basecalls="fastq"` POD5 and FASTQ
only, a run basecalled without alignment, which the daemon aligns itself), to be moved into a live
folder at a pace later. `all/` holds every cell's reads as one `streamer call` input. `prep.json` records what
the pace needs: each cell's staged run folder and its batches' bases and reads.

Preparing is CPU work (POD5 written twice: the finished runs, then their batch files), spread over every
core: it can run on any machine into `.devdata/` (git-ignored) ahead of the GPU box, or there, where it
is skipped when the same data is already in place.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench_end_to_end import _write_copies
from common import STREAMER, new_id, replicate_bam
from streamer.io.fastx import load_basecalls

PREP = "prep.json"


def prepared(work: Path, cells: int, copies: int, file_reads: int, basecalls: str = "bam") -> Path:
    """The folder of one preparation (its parameters in its name)."""
    return work / f"cells{cells}_copies{copies}_reads{file_reads}{'' if basecalls == 'bam' else '_' + basecalls}"


def _cell_pod5(job: tuple[Path, Path, list[int]]) -> None:
    """One POD5 of a finished run: the given copies of every shared read."""
    data, path, copies = job
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ["E2E_FAST5"] = str(data / "fast5_files")
    _write_copies(("pod5", path, copies))


def _cell_basecalls(job: tuple[Path, Path, int, int]) -> None:
    """A finished run's basecalls (FASTA) and aligned BAM: copies first .. first + copies - 1 of every shared read."""
    data, run, first, copies = job
    run.mkdir(parents=True, exist_ok=True)
    seqs = load_basecalls(data / "reads.fasta")
    with open(run / "reads.fasta", "w") as fa:
        for c in range(first, first + copies):
            fa.writelines(f">{new_id(rid, c)}\n{seq}\n" for rid, seq in seqs.items())
    replicate_bam(data / "reads.mg1655.sorted.bam", run / "reads.bam", copies, first=first)


def prepare(data: Path, work: Path, cells: int, copies: int, file_reads: int, basecalls: str = "bam") -> Path:
    """Write (once) `cells` staged runs of `copies` copies each and the joint input; the folder holding them.
    `basecalls`: bam (the batches' aligned BAMs staged) or fastq (none: FASTQ beside the POD5 only).
    Every core works: each cell's POD5 is written in parts at once (in the reads' order), and staged by
    as many processes as there are cores for each cell."""
    root = prepared(work, cells, copies, file_reads, basecalls)
    if (root / PREP).is_file():
        return root
    t0 = time.perf_counter()
    cores = os.cpu_count() or 1
    per_cell = max(1, cores // cells)
    sources = [root / "finished" / f"fc{c}" for c in range(cells)]
    with ProcessPoolExecutor(cores) as pool:
        jobs = [pool.submit(_cell_basecalls, (data, run, c * copies, copies)) for c, run in enumerate(sources)]
        for c, run in enumerate(sources):
            jobs += [pool.submit(_cell_pod5, (data, run / "pod5" / f"part{i:04d}.pod5", list(range(a, b + 1))))
                     for i, (a, b) in enumerate(consecutive_ranges(c * copies, copies, per_cell))]  # fmt: skip
        for job in jobs:
            job.result()
    stagers = [subprocess.Popen([*STREAMER, "replay", str(run), str(root / "staged"),
                                 "--stage-only", "--signal-format", "pod5", "--batch-size", str(file_reads),
                                 "--flowcell", f"FAK{c:05d}", "-t", str(per_cell),
                                 *(["--no-bam"] if basecalls == "fastq" else [])],
                                stdout=subprocess.PIPE,
                                stderr=open(root / f"stage-fc{c}.log", "w"), text=True)
               for c, run in enumerate(sources)]  # fmt: skip
    staged = []
    for p in stagers:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"staging failed ({p.returncode}): see {root}/stage-fc*.log")
        staged.append(Path(out.strip().splitlines()[-1]))
    joint = root / "all"
    (joint / "pod5").mkdir(parents=True, exist_ok=True)
    with open(joint / "reads.fasta", "w") as fa:
        for c, run in enumerate(sources):
            fa.write((run / "reads.fasta").read_text())
            for part in sorted((run / "pod5").glob("*.pod5")):
                (joint / "pod5" / f"fc{c}_{part.name}").symlink_to(part)
    replicate_bam(data / "reads.mg1655.sorted.bam", joint / "reads.bam", cells * copies)
    cells_info = []
    for run in staged:
        batches = json.loads((run / ".replay.json").read_text())["batches"]
        reads = [_fastq_reads(run / b["files"]["fastq"]) for b in batches]
        cells_info.append({"staged": str(run), "name": run.name, "bases": [b["bases"] for b in batches],
                           "reads": reads})  # fmt: skip
    info = {"cells": cells_info, "copies": copies, "file_reads": file_reads,
            "mbases": sum(sum(c["bases"]) for c in cells_info) / 1e6, "seconds": time.perf_counter() - t0}
    (root / PREP).write_text(json.dumps(info, indent=1) + "\n")
    return root


def _fastq_reads(path: Path) -> int:
    with gzip.open(path, "rt") as fh:
        return sum(1 for _ in fh) // 4


def consecutive_ranges(first: int, n: int, parts: int) -> list[tuple[int, int]]:
    """`n` numbers from `first` cut into at most `parts` ranges of consecutive ones (first, last), in order."""
    size = -(-n // max(1, parts))
    return [(a, min(a + size, first + n) - 1) for a in range(first, first + n, size)]


def copies_for(mbases: float, cells: int, data: Path) -> int:
    """Copies per cell of the shared reads for `mbases` Mbases in all (at least one)."""
    one = sum(len(s) for s in load_basecalls(data / "reads.fasta").values()) / 1e6
    return max(1, round(mbases / cells / one + 0.5))
