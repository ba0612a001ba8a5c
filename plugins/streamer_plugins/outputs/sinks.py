"""The outputs of CpG calls as sinks (`streamer.sinks` entry points `calls`, `methfreq`,
`bedmethyl`, `modbam`): the call-methylation TSV, per-site frequency, bedMethyl, modBAM.

All of them take a batch's calls as records (`MethCalls`, in `products["calls"]`). The
tables count the log-likelihood ratio as the TSV prints it (two decimals), as f5c's
meth-freq does on the TSV, so they come out the same from live calls and from the rows the
daemon replays after a restart (`CallRows.replay`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from streamer.errors import InputError
from streamer.io.alignments import AlignmentFilter
from streamer.sinks import BaseSink, Result, SinkContext, SiteChannel, write_atomic
from streamer_plugins.outputs.bedmethyl import BedMethyl
from streamer_plugins.cpg.caller import CALLS
from streamer_plugins.cpg.calls import CALLS_HEADER, MethCalls, format_calls
from streamer_plugins.outputs.methfreq import CALL_THRESHOLD, MethFreq
from streamer_plugins.outputs.modbam import ModCalls, write_modbam

_COLUMNS = CALLS_HEADER.rstrip("\n").split("\t")


@dataclass
class CallBlock:
    """Rows of a calls TSV read back as records, one record per row (a `Result`)."""

    read_ids: list[str]
    ref_names: list[str]
    products: dict[str, Any] = field(default_factory=dict)


METH_TSV = "meth.tsv"
FREQ_TSV = "meth-freq.tsv"
BEDMETHYL = "meth.bed"


class CallRows(BaseSink):
    """The call-methylation TSV (nanopolish/f5c columns with strand): `meth.tsv` in the daemon."""

    header = CALLS_HEADER
    journal = METH_TSV

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> CallRows:
        return cls()

    def render(self, result: Result) -> str:
        return format_calls(result.products[CALLS], result.read_ids, result.ref_names)

    def count(self, result: Result) -> int:
        return len(result.products[CALLS])

    def read_back(self, path: Path, beat: Callable[[], None] = lambda: None, block: int = 100_000) -> Iterator[CallBlock]:
        """The data rows of a calls TSV this sink's host committed, as records, a block at a time."""
        with open(path) as fh:
            next(fh, None)
            line_no = 1
            while rows := list(islice(fh, block)):
                beat()
                yield parse_rows(rows, path, line_no + 1)
                line_no += len(rows)


def parse_rows(rows: list[str], path: Path, first_line: int) -> CallBlock:
    """Data rows of a calls TSV (the first at `first_line` of `path`) as records."""
    n = len(rows)
    cols: list[list[str]] = [[] for _ in _COLUMNS]
    for line_no, line in enumerate(rows, start=first_line):
        fields = line.rstrip("\n").split("\t")
        if len(fields) != len(_COLUMNS):
            raise InputError(path, f"expected {len(_COLUMNS)} columns, found {len(fields)}", line=line_no)
        for c, f in zip(cols, fields):
            c.append(f)
    get = dict(zip(_COLUMNS, cols))
    try:
        calls = MethCalls(
            read=np.arange(n, dtype=np.int64),
            start=np.array(get["start"], dtype=np.int64),
            end=np.array(get["end"], dtype=np.int64),
            strand=np.array([-1 if s == "-" else 1 for s in get["strand"]], dtype=np.int8),
            llr=np.array(get["log_lik_ratio"], dtype=np.float64),
            ll_meth=np.array(get["log_lik_methylated"], dtype=np.float64),
            ll_unmeth=np.array(get["log_lik_unmethylated"], dtype=np.float64),
            num_motifs=np.array(get["num_motifs"], dtype=np.int32),
            sequence=get["sequence"],
        )
    except ValueError as exc:
        raise InputError(path, f"malformed number in rows {first_line}-{first_line + n - 1}: {exc}") from None
    return CallBlock(get["read_name"], get["chromosome"], {CALLS: calls})


class MethFreqTable(BaseSink):
    """Per-site methylation frequency (f5c meth-freq), rewritten to `path` on refresh.

    `table` is the one per-site table (the daemon's publisher serves its snapshots); with
    `track_changes`, `changed` collects the sites each batch touched.
    """

    replays = True

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> MethFreqTable | None:
        if not context.daemon:
            return None
        out = config.output
        return cls(context.out_dir / FREQ_TSV, out.call_threshold, out.split_groups, context.publishing)

    def __init__(self, path: Path | None = None, call_threshold: float = CALL_THRESHOLD, split_groups: bool = False,
                 track_changes: bool = False):  # fmt: skip
        self.path = path
        self.table = MethFreq(call_threshold, split_groups)
        self.changed: set | None = set() if track_changes else None
        self.dirty = True

    def on_batch(self, result: Result) -> None:
        calls = result.products.get(CALLS)
        if calls is not None and len(calls):
            self.table.add_calls(calls, result.ref_names, self.changed)
            self.dirty = True

    def restore(self) -> None:
        if self.changed is not None:
            self.changed.clear()  # the publisher's updates are of sites changed from here on

    def attach(self, channel: SiteChannel) -> None:
        channel.serve("hmm", self.table, self.changed)

    def refresh(self, final: bool = False) -> None:
        if (self.dirty or final) and self.path is not None:
            write_atomic(self.path, self.table.format())
        self.dirty = False


class BedMethylTable(BaseSink):
    """bedMethyl (modkit's 18 columns), rewritten to `path` on refresh."""

    replays = True

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> BedMethylTable | None:
        if context.daemon:
            return cls(context.out_dir / BEDMETHYL, config.output.call_threshold) if config.output.bedmethyl else None
        path = context.files.get("bedmethyl")
        return cls(path) if path is not None else None

    def __init__(self, path: Path, call_threshold: float = CALL_THRESHOLD):
        self.path = path
        self.table = BedMethyl(call_threshold)
        self.dirty = True

    def on_batch(self, result: Result) -> None:
        calls = result.products.get(CALLS)
        if calls is not None and len(calls):
            self.table.add_calls(calls, result.ref_names)
            self.dirty = True

    def refresh(self, final: bool = False) -> None:
        if self.dirty or final:
            text = io.StringIO()
            self.table.write(text)
            write_atomic(self.path, text.getvalue())
        self.dirty = False


class ModBamFile(BaseSink):
    """The alignments of `bam` with the calls as MM/ML tags, written to `path` at the end."""

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> ModBamFile | None:
        f = context.files
        return cls(f["bam"], f["modbam"], f["filter"], f["command_line"]) if f.get("modbam") is not None else None

    def __init__(self, bam: Path, path: Path, filt: AlignmentFilter, command_line: str = ""):
        self.bam, self.path, self.filt, self.command_line = bam, path, filt, command_line
        self.calls = ModCalls()

    def on_batch(self, result: Result) -> None:
        self.calls.add_calls(result.products[CALLS], result.read_ids, result.ref_names)

    def refresh(self, final: bool = False) -> None:
        if final:
            write_modbam(self.bam, self.path, self.calls, self.filt, self.command_line)
