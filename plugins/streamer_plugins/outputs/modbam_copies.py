"""The daemon's modBAM (`streamer.sinks` entry point `modbam-copies`): each basecall BAM, once
all its reads are done, copied with MM/ML tags.

A BAM cannot be appended and cut back the way `meth.tsv` is (BGZF blocks, an index, a
header first), so the unit is the input file: when the ledger has an outcome for every read
of a basecall BAM, the BAM is copied to `modbam/<its path below the watched folder>` with
the calls as MM/ML tags (`write_modbam`, as `streamer call --modbam` writes them), under a
temporary name, fsynced and renamed; then the ledger records it. A crash before the record
only means the same file is written again, whole, at the next start: no record is lost or
doubled, and every record of the input is in its copy, tagged or not.

The calls are taken with the log-likelihood ratio as `meth.tsv` prints it (two decimals),
whether they come from a batch or from the rows replayed at start, so a copy is the same
whether or not the daemon restarted on the way; an ML value may differ by one from the
full-precision ratio's, within the 1/256 that a value stands for. They are held only for
reads of BAMs not copied yet, so memory is bounded by the BAMs in progress. A BAM that late
reads reopen (their signal came after they were reported missing it) is copied again once
they are done, from its earlier copy: its other reads carry their tags there, and only the
late reads' records are tagged, so `meth.tsv` is never read back mid-run. After a restart
the replay of the committed calls gives every read of a reopened BAM its calls again, and the
copy is made from the input.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Container, Mapping
from pathlib import Path
from typing import Any

import pysam

from streamer.errors import InputError
from streamer.io.alignments import AlignmentFilter
from streamer.sinks import BaseSink, Result, SinkContext, SinkLedger
from streamer_plugins.cpg.caller import CALLS
from streamer_plugins.outputs.modbam import ModCalls, write_modbam

log = logging.getLogger(__name__)

MODBAM_DIR = "modbam"


class ModBamCopies:
    """Calls of reads whose BAM is not copied yet, and the copying."""

    def __init__(self, out_dir: Path, watch_dir: Path, filt: AlignmentFilter):
        self.dir = Path(out_dir) / MODBAM_DIR
        self.watch_dir = Path(watch_dir)
        self.filt = filt
        self.calls = ModCalls()

    def add(self, result: Result, wanted: Container[str]) -> None:
        """Add a batch's calls of the `wanted` reads, the ratio as printed."""
        calls = result.products[CALLS]
        read_ids, ref_names = result.read_ids, result.ref_names
        for j in range(len(calls)):
            i = int(calls.read[j])
            if read_ids[i] in wanted:
                self.calls.add(read_ids[i], ref_names[i], bool(calls.strand[j] < 0), int(calls.start[j]),
                               round(float(calls.llr[j]), 2), calls.sequence[j])  # fmt: skip

    def path_of(self, bam: Path) -> Path:
        try:
            rel = Path(bam).resolve().relative_to(self.watch_dir.resolve())
        except ValueError:
            rel = Path(Path(bam).name)
        return self.dir / rel

    def write(self, bam: Path, read_ids: set[str], again: bool = False) -> Path:
        """Copy `bam` with its reads' calls, atomically; forget those calls, copied or not.
        `again`: from its earlier copy, where there is one (see the module's docstring).

        InputError if it cannot be read, or has no alignments to carry the calls (unaligned
        BAM: the daemon aligned its reads itself and keeps no records of that).
        """
        try:
            return self._write(bam, again)
        finally:
            for key in [k for k in self.calls.by_record if k[0] in read_ids]:
                del self.calls.by_record[key]

    def _write(self, bam: Path, again: bool) -> Path:
        out = self.path_of(bam)
        again = again and out.is_file()
        try:
            with pysam.AlignmentFile(str(bam), "rb", check_sq=False) as fh:
                aligned = fh.nreferences > 0
        except (OSError, ValueError) as exc:
            raise InputError(bam, f"cannot open it for its modBAM copy: {exc}") from exc
        if not aligned:
            raise InputError(bam, "unaligned BAM: no alignments to carry the calls, so no modBAM copy")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        try:
            write_modbam(out if again else bam, tmp, self.calls, self.filt, f"streamer run (modBAM of {bam})", again)
        except pysam.utils.SamtoolsError as exc:  # only the index: the copy is whole
            log.warning("%s: its modBAM copy is not indexed (its header says sorted, its records are not): %s",
                        bam, str(exc).strip())
        except (OSError, ValueError) as exc:
            tmp.unlink(missing_ok=True)
            raise InputError(bam, f"cannot copy it as modBAM: {exc}") from exc
        except InputError:
            tmp.unlink(missing_ok=True)
            raise
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        index = tmp.with_name(tmp.name + ".bai")
        os.replace(tmp, out)
        if index.exists():
            os.replace(index, out.with_name(out.name + ".bai"))
        _sync_dir(out.parent)
        return out


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ModBamCopiesSink(BaseSink):
    """Sink `modbam-copies` (`output.modbam`): the calls of reads of BAMs not copied yet, taken from
    each committed batch, and the copy of each BAM whose reads are all done."""

    replays = True

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> ModBamCopiesSink | None:
        if not (context.daemon and config.output.modbam):
            return None
        filt = AlignmentFilter(min_mapq=config.alignment.min_mapq, secondary=config.alignment.secondary)
        return cls(ModBamCopies(context.out_dir, config.watch.dir, filt), context.ledger, context.beat)

    def __init__(self, copies: ModBamCopies, ledger: SinkLedger, beat: Callable[[], None]):
        self.copies, self.ledger, self.beat = copies, ledger, beat
        self.awaiting: set[str] | None = None  # reads of the BAMs not copied yet
        self.reopened: set[int] = set()  # BAMs copied before and reopened since this start
        self.restored = False  # BAMs are copied once the committed calls are all replayed

    def on_batch(self, result: Result) -> None:
        if self.awaiting is None:
            self.awaiting = self.ledger.reads_awaiting_modbam()
        if self.awaiting:
            self.copies.add(result, self.awaiting)
        if self.restored:
            self._write()

    def on_file(self, kind: str, fmt: str) -> None:
        if kind == "basecalls" and fmt == "bam":
            self.awaiting = None  # its reads are awaited too

    def restore(self) -> None:
        self.restored = True
        self._write()

    def refresh(self, final: bool = False) -> None:
        if self.restored:
            self._write()  # BAMs whose last reads were closed without a batch (missing their partner)

    def on_reopened(self, file_ids: tuple[int, ...]) -> None:
        """A reopened BAM is copied again, from its earlier copy, once its late reads are done."""
        self.reopened.update(file_ids)
        self.awaiting = None

    def _write(self) -> None:
        """The modBAM copy of every basecall BAM whose reads are now all done."""
        for fid, path in self.ledger.finished_bams():
            self.beat()
            try:
                out = self.copies.write(path, self.ledger.reads_of_file(fid), again=fid in self.reopened)
            except InputError as exc:
                log.warning("%s", exc)
                self.ledger.record_modbam(fid, None, exc.reason)
                continue
            self.ledger.record_modbam(fid, out)
            self.reopened.discard(fid)
            log.info("%s: modBAM written to %s", path, out)
            self.awaiting = None

    def summary(self) -> Mapping[str, Any]:
        return {"modbam": self.ledger.modbam_counts()}
