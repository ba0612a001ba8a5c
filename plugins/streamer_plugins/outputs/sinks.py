"""The outputs of methylation calls as sinks (`streamer.sinks` entry points `calls`, `methfreq`,
`bedmethyl`, `modbam`): the call-methylation TSV, per-site frequency, bedMethyl, modBAM.

All of them take a batch's calls as records (`MethCalls`, in `products["calls"]`). The
tables count the log-likelihood ratio as the TSV prints it (two decimals), as f5c's
meth-freq does on the TSV, so they come out the same from live calls and from rows read back
(`CallRows.read_back`: the daemon's start-up replay, `streamer meth-freq`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from streamer.io.alignments import AlignmentFilter
from streamer.pore.motifs import motif
from streamer.sinks import BaseSink, Result, SinkContext, SiteChannel, write_atomic
from streamer_plugins.cpg.caller import CALLS
from streamer_plugins.cpg.calls import CALLS_HEADER, format_calls
from streamer_plugins.outputs.bedmethyl import BedMethyl
from streamer_plugins.outputs.calls_tsv import CallBlock, read_calls_file
from streamer_plugins.outputs.methfreq import MethFreq
from streamer_plugins.outputs.modbam import ModCalls, write_modbam

METH_TSV = "meth.tsv"
FREQ_TSV = "meth-freq.tsv"
BEDMETHYL = "meth.bed"


class CallRows(BaseSink):
    """The call-methylation TSV (nanopolish/f5c columns with strand): `meth.tsv` in the daemon."""

    header = CALLS_HEADER
    journal = METH_TSV

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> CallRows | None:
        return None if context.command == "eventalign" else cls()

    def render(self, result: Result) -> str:
        return format_calls(result.products[CALLS], result.read_ids, result.ref_names)

    def count(self, result: Result) -> int:
        return len(result.products[CALLS])

    def read_back(self, path: Path, beat: Callable[[], None] = lambda: None) -> Iterator[CallBlock]:
        """The data rows of a calls TSV, as records, a block at a time."""
        return read_calls_file(path, beat)


class MethFreqTable(BaseSink):
    """Per-site methylation frequency (f5c meth-freq), rewritten to `path` (a file, or a stream such as
    stdout, written once at the end) on refresh: `meth-freq.tsv` in the daemon, `streamer meth-freq`'s output.

    `table` is the one per-site table (the daemon's publisher serves its snapshots); with
    `track_changes`, `changed` collects the sites each batch touched.
    """

    replays = True

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> MethFreqTable | None:
        path = context.out_dir / FREQ_TSV if context.daemon else context.files.get("methfreq")
        if path is None:
            return None
        out = config.output
        settings = (out.call_threshold, out.split_groups, motif(config.pipeline.methylation),
                    out.freq_compat == "nanopolish")  # fmt: skip
        # kernels compiled (or loaded from numba's cache) at open, not on the daemon's first batch
        MethFreq(*settings).add("warm-up", 0, 2, 9.0, 2, "ACGTACGT", set())
        return cls(path, MethFreq(*settings), context.publishing)

    def __init__(self, path: Path | TextIO | None = None, table: MethFreq | None = None, track_changes: bool = False):
        self.path = path
        self.table = table or MethFreq()
        self.changed: set | None = set() if track_changes else None
        self.dirty = True

    def on_batch(self, result: Result) -> None:
        calls = result.products.get(CALLS)
        if isinstance(result, CallBlock):  # rows read back: the group column is named after theirs
            self.table.group_column = result.group_column
        if calls is not None and len(calls):
            self.table.add_calls(calls, result.ref_names, self.changed)
            self.dirty = True

    def restore(self) -> None:
        if self.changed is not None:
            self.changed.clear()  # the publisher's updates are of sites changed from here on

    def attach(self, channel: SiteChannel) -> None:
        channel.serve("hmm", self.table, self.changed)

    def refresh(self, final: bool = False) -> None:
        if isinstance(self.path, Path) and (self.dirty or final):
            write_atomic(self.path, self.table.chunks())
        elif self.path is not None and final:
            self.table.write(self.path)
        self.dirty = False


class BedMethylTable(BaseSink):
    """bedMethyl (modkit's 18 columns), rewritten to `path` on refresh."""

    replays = True

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> BedMethylTable | None:
        if context.daemon:
            path = context.out_dir / BEDMETHYL if config.output.bedmethyl else None
        else:
            path = context.files.get("bedmethyl")
        if path is None:
            return None
        settings = (config.output.call_threshold, motif(config.pipeline.methylation))
        BedMethyl(*settings).add("warm-up", "+", 0, 9.0, "ACGTACGT")  # compiled at open, as the frequency table's
        return cls(path, BedMethyl(*settings))

    def __init__(self, path: Path, table: BedMethyl | None = None):
        self.path = path
        self.table = table or BedMethyl()
        self.dirty = True

    def on_batch(self, result: Result) -> None:
        calls = result.products.get(CALLS)
        if calls is not None and len(calls):
            self.table.add_calls(calls, result.ref_names)
            self.dirty = True

    def refresh(self, final: bool = False) -> None:
        if self.dirty or final:
            write_atomic(self.path, self.table.chunks())
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
