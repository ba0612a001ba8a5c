"""What several benchmarks share: the replicated read ids and BAM, a timed `streamer call`, the GPU table.

Benchmarks run as scripts (`python benchmarks/bench_x.py`), so this folder is on their path.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pysam

# `python -m streamer` as an installed user's `streamer`: `-P` keeps the current folder off the module path, so
# a benchmark started at a checkout's root times the installed package (its bytecode compiled at install), not
# the checkout's sources, compiled again in every process where bytecode is not written (PYTHONDONTWRITEBYTECODE)
STREAMER = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", "streamer"]


def streamer(*args) -> list[str]:
    """The command line `streamer ARGS` (paths and numbers as text)."""
    return [*STREAMER, *map(str, args)]


def new_id(read_id: str, copy: int) -> str:
    """The read id of copy `copy` of a read: the same in every benchmark, so their inputs can be shared."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{read_id}/{copy}"))


def replicate_bam(src: Path, out: Path, copies: int, threads: int = 1, first: int = 0) -> list[pysam.AlignedSegment]:
    """`copies` copies of every record of `src` (copies `first`, `first` + 1, ...) under `new_id`s, sorted
    and indexed as `out`; the source records are returned."""
    unsorted = out.with_name("unsorted.bam")
    with pysam.AlignmentFile(src) as bam_in:
        records = list(bam_in)
        with pysam.AlignmentFile(unsorted, "wb", template=bam_in) as bam_out:
            for c in range(first, first + copies):
                for rec in records:
                    rec = pysam.AlignedSegment.fromstring(rec.to_string(), bam_in.header)
                    rec.query_name = new_id(rec.query_name, c)
                    bam_out.write(rec)
    pysam.sort("-@", str(threads), "-o", str(out), str(unsorted))
    pysam.index(str(out))
    unsorted.unlink()
    return records


def timed_call(args: list[str], log: Path) -> float:
    """Wall seconds of one `streamer call` with `args`, its stderr kept in `log`."""
    t0 = time.perf_counter()
    with open(log, "w") as err:
        subprocess.run([*STREAMER, "call", *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=err)  # fmt: skip
    return time.perf_counter() - t0


def gpu_rows(gpu: dict, cpu_s: float, kernel_key: str, exact: Callable[[dict], str]) -> list[str]:
    """One table row per GPU layout: its best run's stage times, Gcells/s and speed against the CPU."""
    rows = []
    for name, g in gpu.items():
        r = min(g["runs"], key=lambda r: r["wall_s"])
        rows.append(f"| GPU {name} | {r['wall_s']:.3f} | {r['t_pack']:.3f} | {r['t_h2d']:.3f} | "
                    f"{r[kernel_key]:.3f} | {r['t_d2h']:.3f} | {r['cells'] / r[kernel_key] / 1e9:.2f} | "
                    f"{cpu_s / r['wall_s']:.1f}x | {exact(g)} |")  # fmt: skip
    return rows


def shared_data_parser(doc: str, work: str) -> argparse.ArgumentParser:
    """The command line of a benchmark over the shared reads: --data, --out and its scratch folder."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the shared ecoli_2kb_region folder")
    ap.add_argument("--out", type=Path, required=True, help="results folder")
    ap.add_argument("--work", type=Path, default=Path(work), help="scratch folder [%(default)s]")
    return ap
