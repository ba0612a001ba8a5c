"""The daemon's `modkit` sink: which basecall BAMs are counted into the live modkit table
(`streamer_plugins.modbase.live.LiveModTable`), once each, through the ledger, and the table's
checkpoint.

A BAM is counted when the ledger registers it, then recorded in the ledger with its counts;
a restart takes the table from the checkpoint (if it holds only files the ledger still has as
counted, as they are now) and counts the others again. Counts cannot be taken back, so a file
counted before in another state, or one that fails part-way, means a rebuild from the other
counted files. A file whose calls cannot be counted (unreadable, gone, contigs other than the
run's first BAM) is recorded as such with one line, and never stops the daemon.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamer.errors import InputError, one_line
from streamer.sinks import BaseSink, SinkContext, SinkLedger, SiteChannel

if TYPE_CHECKING:  # imported where the sink is on: every run loads the sinks to ask them
    from streamer_plugins.modbase.live import LiveModTable

log = logging.getLogger(__name__)

MODKIT_BED = "modkit.bed"  # dorado's MM/ML calls aggregated as `modkit pileup`
THRESHOLDS = "modcall_thresholds"  # ledger meta: the pass thresholds estimated for the run
UNREADABLE = -1  # the ledger's call count of a BAM whose calls could not be read
CHECKPOINT = "modkit-counts.pickle"  # in the state folder
CHECKPOINT_S = 300.0  # a checkpoint costs a write of the whole table (GBs for a human genome)

FileState = tuple[int, int, int]  # (file id, size, mtime_ns) of a BAM as counted


class ModkitSink(BaseSink):
    """`modkit.bed` of the run's basecall BAMs (`modcalls.*`), kept with the daemon's ledger."""

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> ModkitSink | None:
        mc = config.modcalls
        if not (mc.enabled and context.daemon):
            return None
        from streamer_plugins.modbase.live import LiveModTable

        table = LiveModTable(
            context.out_dir / MODKIT_BED, config.reference.genome, track_changes=context.publishing,
            filter_threshold=mc.filter_threshold, filter_percentile=mc.filter_percentile, no_filtering=mc.no_filtering,
            cpg=mc.cpg, combine_strands=mc.combine_strands, ignore=mc.ignore, combine_mods=mc.combine_mods,
        )  # fmt: skip
        return cls(table, context.ledger, context.state_dir / CHECKPOINT, context.begin, context.beat)

    def __init__(self, table: LiveModTable, ledger: SinkLedger, checkpoint: Path, begin: Callable[..., Any],
                 beat: Callable[[], None] = lambda: None):
        self.table, self.ledger, self.checkpoint, self.beat = table, ledger, checkpoint, beat
        self.begin = begin  # where each BAM is first read through: off the daemon's engine
        self._reading: dict[int, tuple[Path, int, int, Any]] = {}  # file id -> (path, size, mtime_ns, its reading)
        self.channel: SiteChannel | None = None
        self._files: set[FileState] = set()  # the BAMs in the table
        self._saved: set[FileState] = set()  # those the checkpoint holds
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S

    def attach(self, channel: SiteChannel) -> None:
        self.channel = channel
        channel.serve("dorado", self.table)

    def restore(self) -> None:
        """The table as the ledger says it was (its checkpoint and the BAMs counted after it), then any
        registered BAM not yet counted (a kill came between its registration and its count)."""
        saved = self.ledger.meta(THRESHOLDS)
        if saved is not None:
            self.table.restore_thresholds(saved)
        self._rebuild(checkpoint=True)
        self._count()
        self.table.take_changes()  # the publisher's updates are of sites changed from here on

    def on_file(self, kind: str, fmt: str) -> None:
        if kind == "basecalls" and fmt == "bam":
            self._count(wait=False)

    def refresh(self, final: bool = False) -> None:
        self._count(wait=final)
        self.table.dirty |= final
        self.table.refresh()
        self._save(final)

    def summary(self) -> Mapping[str, Any]:
        return {"modcalls": self.ledger.modcall_counts() | {"output": MODKIT_BED,
                                                            "pileup_options": self.table.describe()}}

    def _rebuild(self, checkpoint: bool = False) -> None:
        """The table from the counted BAMs alone: from the checkpoint if it holds only files the ledger
        still has as counted (as they are now), then the others; one that cannot be read through any
        more is recorded as unreadable, and the table rebuilt without it."""
        while True:
            recorded = self.ledger.modcall_files()
            self.table.reset()
            self._files = set()
            held = self.table.load(self.checkpoint) if checkpoint else None
            if held is not None and set(held) <= {(f, size, mtime) for f, _, size, mtime in recorded}:
                self._files = set(held)
                self._saved = set(held)
                log.info("%s: the counts of %d BAMs restored from the checkpoint", MODKIT_BED, len(held))
            elif held is not None:
                self.table.reset()
            for fid, path, size, mtime_ns in recorded:
                if (fid, size, mtime_ns) in self._files:
                    continue
                self.beat()
                try:
                    self.table.add_file(path)
                except Exception as exc:  # noqa: BLE001 - one file's fault never stops the daemon
                    self._unreadable(fid, path, size, mtime_ns, exc)
                    break
                self._files.add((fid, size, mtime_ns))
            else:
                return
            checkpoint = False

    def _count(self, wait: bool = True) -> None:
        """Begin reading each registered BAM not counted yet, off the engine; then count those read, in
        order (`wait`: every one), and record each: the table holds each file once."""
        from streamer_plugins.modbase.live import tagless_reads  # loaded with the table (`open`)

        for fid, path, size, mtime_ns, changed in self.ledger.uncounted_bams():
            if fid in self._reading:
                continue
            self.beat()
            if changed:
                log.info("%s changed after its modified-base calls were counted: rebuilding %s", path, MODKIT_BED)
                self.ledger.forget_modcalls([fid])
                self._rebuild()
            self._reading[fid] = (path, size, mtime_ns, self.begin(tagless_reads, path))
        while self._reading:
            fid, (path, size, mtime_ns, reading) = next(iter(self._reading.items()))
            if not (wait or reading.done()):
                break
            del self._reading[fid]
            self.beat()
            self._count_file(fid, path, size, mtime_ns, reading)
        changes = self.table.take_changes()
        if self.channel is not None and changes is not None:
            self.channel.publish_modcalls(changes)

    def _count_file(self, fid: int, path: Path, size: int, mtime_ns: int, reading: Any) -> None:
        """One BAM, read through (`reading`: how many reads it has if none has calls): counted, recorded."""
        try:
            tagless = reading.result()
        except Exception as exc:  # noqa: BLE001 - nothing of it is counted yet
            self._unreadable(fid, path, size, mtime_ns, exc)
            return
        if tagless is not None or (self.table.thresholds is None and not self._estimate(path)):
            # no calls to count in it; its reads count once the run's thresholds are known, as in add_file
            reads = (tagless or 0) if self.table.thresholds is not None else 0
            self.ledger.record_modcalls(fid, size, mtime_ns, reads, 0)
            return
        try:
            n_reads, n_calls = self.table.add_file(path)
        except Exception as exc:  # noqa: BLE001 - one file's fault never stops the daemon
            self._unreadable(fid, path, size, mtime_ns, exc)
            self._rebuild()
            return
        self.ledger.record_modcalls(fid, size, mtime_ns, n_reads, n_calls)
        if n_calls:
            self._files.add((fid, size, mtime_ns))
            log.info("%s: %d modified-base calls of %d reads counted into %s", path, n_calls, n_reads, MODKIT_BED)

    def _unreadable(self, fid: int, path: Path, size: int, mtime_ns: int, exc: Exception) -> None:
        """One line, and the ledger's record of the file (as it is now) as unreadable: never counted again."""
        log.warning("%s: its modified-base calls are not counted: %s", path, _why(exc))
        log.debug("%s", path, exc_info=True)
        self.ledger.record_modcalls(fid, size, mtime_ns, 0, UNREADABLE)

    def _estimate(self, path: Path) -> bool:
        """The run's pass thresholds from its first BAM with calls, kept in the ledger; False when it has none."""
        try:
            thresholds = self.table.estimate(path)
        except Exception as exc:  # noqa: BLE001 - one file's fault never stops the daemon
            log.warning("%s: no pass thresholds from its modified-base calls: %s", path, _why(exc))
            return False
        if not thresholds.per_base:
            return False
        self.table.use_thresholds(thresholds)
        self.ledger.set_meta(THRESHOLDS, self.table.thresholds_text)
        log.info("modified-base pass thresholds estimated from %s: streamer pileup %s gives %s offline", path,
                 self.table.describe(), MODKIT_BED)
        return True

    def _save(self, final: bool) -> None:
        """A checkpoint of the counts, every `CHECKPOINT_S` and at exit, when files were counted since the
        last: a restart then reads only the BAMs counted after it, not the whole run again."""
        if self._files == self._saved or self.table.counts is None:
            return
        if not final and time.monotonic() < self._next_checkpoint:
            return
        self.table.save(self.checkpoint, sorted(self._files))
        self._saved = set(self._files)
        self._next_checkpoint = time.monotonic() + CHECKPOINT_S


def _why(exc: Exception) -> str:
    return exc.reason if isinstance(exc, InputError) else one_line(exc)
