"""Cost per call of the frequency tables' `add_calls` (meth-freq.tsv and bedMethyl), as the daemon's
sinks pay it on each batch's calls.

The calls of a calls TSV (default: the E. coli fixture's f5c calls) are replicated `--copies` times,
each copy shifted along the contig so that sites stay about as many as calls (low coverage, the
daemon's usual case), and fed in blocks of `--batch` calls, one record per read as in the daemon's
batches (`--per-row`: one record per row, as calls read back from a TSV are); reports microseconds per call for
`MethFreq.add_calls` (with and without the publisher's changed keys, and with split groups) and
`BedMethyl.add_calls`. The first block of each is a warm-up (compilation) and is not timed.

Then the rewrite the daemon makes of both tables every `refresh_interval` (`write_atomic` of `chunks()`,
compiled, without the GIL), timed against the same rows formatted by Python from `rows()`, as they were
written before; the bytes are checked equal. With `--copies 2000` the tables hold about a million sites:

    python benchmarks/bench_freq_tables.py --copies 400 --batch 20000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from streamer.sinks import write_atomic
from streamer_plugins.outputs.bedmethyl import COLOUR, BedMethyl
from streamer_plugins.outputs.calls_tsv import CallBlock, read_calls
from streamer_plugins.outputs.methfreq import MethFreq

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "ecoli" / "meth.f5c-1.1.tsv"


def shifted_rows(path: Path, copies: int, shift: int = 10_000_000) -> tuple[str, list[str]]:
    """The header and the rows of `path`, `copies` times, copy i's positions moved by i * `shift`."""
    header, *rows = path.read_text().splitlines(keepends=True)
    out = []
    for i in range(copies):
        for row in rows:
            f = row.split("\t")
            f[2], f[3] = str(int(f[2]) + i * shift), str(int(f[3]) + i * shift)
            out.append("\t".join(f))
    return header, out


def per_read(block: CallBlock) -> CallBlock:
    """The block's calls as a batch holds them: one record per (read, contig)."""
    records: dict[tuple[str, str], int] = {}
    calls = block.products["calls"]
    read = [records.setdefault(key, len(records)) for key in zip(block.read_ids, block.ref_names)]
    calls = replace(calls, read=np.array(read, np.int64)[calls.read])
    return CallBlock([r for r, _ in records], [c for _, c in records], {"calls": calls})


def timed(tables, blocks) -> float:
    """Seconds spent in `add_calls` over all blocks but the first (warm-up)."""
    total = 0.0
    for i, block in enumerate(blocks):
        calls = block.products["calls"]
        t0 = time.perf_counter()
        tables(calls, block.ref_names)
        if i:
            total += time.perf_counter() - t0
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=Path, default=FIXTURE)
    ap.add_argument("--copies", type=int, default=400)
    ap.add_argument("--batch", type=int, default=20_000, help="calls per batch")
    ap.add_argument("--per-row", action="store_true", help="one record per row, as calls read back are")
    args = ap.parse_args()
    header, rows = shifted_rows(args.calls, args.copies)
    blocks = list(read_calls([header, *rows], block=args.batch))
    if not args.per_row:
        blocks = [per_read(b) for b in blocks]
    n = sum(len(b.products["calls"]) for b in blocks[1:])
    plain, freq, split, bed, changed = MethFreq(), MethFreq(), MethFreq(split_groups=True), BedMethyl(), set()
    cases = {
        "MethFreq.add_calls": lambda c, r: plain.add_calls(c, r),
        "MethFreq.add_calls, changed keys": lambda c, r: freq.add_calls(c, r, changed),
        "MethFreq.add_calls, split groups": lambda c, r: split.add_calls(c, r),
        "BedMethyl.add_calls": lambda c, r: bed.add_calls(c, r),
    }
    print(f"{n} calls timed, batches of {args.batch}")
    for name, add in cases.items():
        print(f"{name}: {timed(add, blocks) / n * 1e6:.3f} us per call")
    with tempfile.TemporaryDirectory() as tmp:
        for name, table, python in (("meth-freq.tsv", plain, freq_rows), ("meth.bed", bed, bed_rows)):
            write_atomic(Path(tmp) / name, table.chunks())  # compiled, or loaded from numba's cache
            t0 = time.perf_counter()
            write_atomic(Path(tmp) / name, table.chunks())
            t1 = time.perf_counter()
            text = python(table)
            t2 = time.perf_counter()
            same = (Path(tmp) / name).read_text().endswith(text)
            print(f"{name} rewritten: {t1 - t0:.3f} s compiled, {t2 - t1:.3f} s formatted by Python "
                  f"({len(text.splitlines())} sites, {(t2 - t1) / (t1 - t0):.1f}x; identical: {same})")


def freq_rows(table: MethFreq) -> str:
    return "".join(f"{c}\t{s}\t{e}\t{st.group_size}\t{st.called_sites}\t{st.called_sites_methylated}"
                   f"\t{st.called_sites_methylated / st.called_sites:.3f}\t{st.sequence}\n"
                   for c, s, e, st in table.rows())  # fmt: skip


def bed_rows(table: BedMethyl) -> str:
    return "".join(f"{c}\t{p}\t{p + 1}\t{table.motif.mod_code}\t{k.n_valid}\t{s}\t{p}\t{p + 1}\t{COLOUR}\t{k.n_valid}"
                   f"\t{100 * k.n_mod / k.n_valid:.2f}\t{k.n_mod}\t{k.n_canonical}\t0\t0\t{k.n_fail}\t0\t0\n"
                   for c, p, s, k in table.rows())  # fmt: skip


if __name__ == "__main__":
    main()
