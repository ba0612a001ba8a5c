"""The call-methylation TSV read back as records: the one parser of the calls TSV.

It reads what `streamer call` and the daemon's `meth.tsv` write (f5c's columns with a strand)
and what nanopolish and older f5c write (no strand, `num_cpgs`), a block of rows at a time,
each block a `Result` of one record per row (`products["calls"]`), so that the tables take
rows read back exactly as they take a batch's calls. A bad row is named by its line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from streamer.errors import InputError
from streamer_plugins.cpg.caller import CALLS
from streamer_plugins.cpg.calls import MethCalls
from streamer_plugins.texts import Texts

_COLUMNS = (
    "chromosome\t{strand}start\tend\tread_name\tlog_lik_ratio\tlog_lik_methylated\tlog_lik_unmethylated"
    "\tnum_calling_strands\t{count}\tsequence"
)
# Accepted headers -> (has a strand column, the count column's name).
_HEADERS = {_COLUMNS.format(strand=strand, count=count): (bool(strand), count)
            for strand in ("", "strand\t") for count in ("num_cpgs", "num_motifs")}  # fmt: skip
BLOCK = 100_000  # rows per record block


@dataclass
class CallBlock:
    """Rows of a calls TSV as records, one record per row (a `streamer.sinks.Result`); `group_column`
    is what meth-freq names its group-size column after the file's count column."""

    read_ids: list[str]
    ref_names: list[str]
    products: dict[str, Any] = field(default_factory=dict)
    group_column: str = "num_motifs_in_group"


def read_calls_file(path: Path, beat: Callable[[], None] = lambda: None, block: int = BLOCK) -> Iterator[CallBlock]:
    """The rows of the calls TSV `path`, a block at a time (`beat` between blocks)."""
    try:
        with open(path) as fh:
            yield from read_calls(fh, path, beat, block)
    except OSError as exc:
        raise InputError(path, f"cannot read calls: {exc.strerror}") from exc


def read_calls(lines: Iterable[str], source: str | Path = "<calls>", beat: Callable[[], None] = lambda: None,
               block: int = BLOCK) -> Iterator[CallBlock]:  # fmt: skip
    """The rows after a calls TSV header in `lines`, a block at a time."""
    it = iter(lines)
    header = next(it, None)
    if header is None:
        raise InputError(source, "empty file, expected a call-methylation header", line=1)
    fmt = _HEADERS.get(header.rstrip("\n"))
    if fmt is None:
        raise InputError(source, f"not a call-methylation header: {header.strip()!r}", line=1)
    has_strand, count = fmt
    line_no = 2
    while rows := list(islice(it, block)):
        beat()
        yield _parse(rows, source, line_no, has_strand, f"{count}_in_group")
        line_no += len(rows)


def _parse(rows: list[str], source: str | Path, first: int, has_strand: bool, group_column: str) -> CallBlock:
    n_fields = 11 if has_strand else 10
    cols: list[list[str]] = [[] for _ in range(11)]
    for line_no, line in enumerate(rows, start=first):
        fields = line.rstrip("\n").split("\t")
        if len(fields) != n_fields:
            raise InputError(source, f"expected {n_fields} columns, found {len(fields)}", line=line_no)
        if not has_strand:
            fields.insert(1, "+")
        for c, f in zip(cols, fields):
            c.append(f)
    chrom, strand, start, end, read, llr, ll_m, ll_u, _, num, seq = cols
    try:
        sequence = Texts.of(seq)
    except UnicodeEncodeError:
        bad = next(i for i, s in enumerate(seq) if not s.isascii())
        raise InputError(source, f"sequence is not ASCII: {seq[bad]!r}", line=first + bad) from None
    try:
        calls = MethCalls(
            read=np.arange(len(rows), dtype=np.int64),
            start=np.array(start, dtype=np.int64),
            end=np.array(end, dtype=np.int64),
            strand=np.array([-1 if s == "-" else 1 for s in strand], dtype=np.int8),
            llr=np.array(llr, dtype=np.float64),
            ll_meth=np.array(ll_m, dtype=np.float64),
            ll_unmeth=np.array(ll_u, dtype=np.float64),
            num_motifs=np.array(num, dtype=np.int32),
            sequence=sequence,
        )
    except ValueError:
        raise _first_bad(source, first, start, end, llr, ll_m, ll_u, num) from None
    negative = (calls.start < 0) | (calls.end < 0) | (calls.num_motifs < 0)
    if negative.any():
        raise InputError(source, "coordinates and motif counts cannot be negative", line=first + int(negative.argmax()))
    return CallBlock(read, chrom, {CALLS: calls}, group_column)


def _first_bad(source: str | Path, first: int, *columns: list[str]) -> InputError:
    """The first row with a malformed number (the block was converted whole, for speed)."""
    for i, values in enumerate(zip(*columns)):
        try:
            for kind, text in zip((int, int, float, float, float, int), values):
                kind(text)
        except ValueError as exc:
            return InputError(source, f"malformed number: {exc}", line=first + i)
    return InputError(source, "malformed number", line=first)
