"""The daemon's file intake: a file the watcher reports complete, registered in the ledger.

Signal files give their read ids (`streamer.io.signal.signal_read_ids`), basecall files their
reads (`streamer.daemon.basecall_cache.read_basecall_file`, through the cache's reader); the ledger joins the two by read id. Every
file ends in an outcome the ledger records: registered, or set aside with its reason (one that
vanished before it was read included), once, whatever exception its reader raised: a
damaged file must never stop the daemon, at this start or the next. STOP and `final_summary`
files go to the end-of-run policy, the latter with how many files of each format the daemon is to
see of that run (`streamer.daemon.policy.files_to_account`). The completeness checks themselves
live with the format readers, which the watcher asks.

Files are read in the daemon's parsing processes (`streamer.pipeline.parsing`), begun as they land, a few
files ahead (`Landings`), and taken into the ledger in the order they landed, one batch file at a time:
the files of one poll that MinKNOW named alike (a batch's POD5, BAM and FASTQ) together, so a batch
started between them finds every partner file, the FASTQ that stands in for an unreadable BAM among
them. The engine thread only waits for what is read, and starts batches and commits them in between.

Where a run writes both BAM and FASTQ (`basecalls: auto`), the choice is made read by read: the
FASTQ is registered as a spare, and a read takes its basecalls from it only if no BAM record of
it can be read: its BAM (the one of the same name) was set aside, or the run ended without one.
Each time a spare is used, one line says which file was passed over and why. (A BAM registered
fine that fails when its reads are loaded again passes them on in the batch path,
`streamer.daemon.batches.basecalls_of`, read by read: the ledger knows each read's spare.)
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TypeVar

from streamer.daemon.policy import RECOVERED, EndOfRun, files_to_account
from streamer.errors import InputError, one_line
from streamer.io.alignments import AlignmentFilter
from streamer.io.signal import SIGNAL_SUFFIXES, signal_read_ids
from streamer.daemon.basecall_cache import SPARE_USED, BasecallCache, ReadBasecalls, read_basecall_file
from streamer.daemon.ledger import Ledger, Registered
from streamer.daemon.runfolder import Kind, RunFile, RunLayout, files_written
from streamer.daemon.watch import VANISHED, Ready, Rejected
from streamer.pipeline.parsing import Parsed, ParseProcess

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Landing:
    """A file the watcher reported, and its reading (ids or basecalls), begun (`FileIntake.begin`)."""

    outcome: Ready | Rejected
    read: Parsed | None = None  # None: nothing to read (set aside, STOP, a final summary)

    def done(self) -> bool:
        return self.read is None or self.read.done()


class FileIntake:
    """Takes the watcher's outcomes into the ledger, the basecall cache and the end-of-run policy.

    `on_reopened_bams` gets the ledger ids of basecall BAMs whose modBAM copy must be made again
    (a late signal file reopened some of their reads); `on_bam` is told of each basecall BAM
    registered (its modified-base calls are counted then). `parser` reads the files.
    """

    def __init__(self, ledger: Ledger, cache: BasecallCache, filt: AlignmentFilter, end: EndOfRun, layout: RunLayout,
                 on_reopened_bams: Callable[[tuple[int, ...]], None], on_bam: Callable[[], None], parser: ParseProcess):
        self.ledger, self.cache, self.filt, self.end, self.layout = ledger, cache, filt, end, layout
        self.on_reopened_bams = on_reopened_bams
        self.on_bam = on_bam
        self.parser = parser
        self._spare_runs: set[Path] = set()  # runs whose FASTQ was said to be the spare source

    def begin(self, outcome: Ready | Rejected) -> Landing:
        """The file's reading begun: a signal file's read ids, a basecall file's reads (`take` ends it)."""
        if isinstance(outcome, Ready):
            f = outcome.file
            if f.kind is Kind.SIGNAL and f.path.suffix.lower() in SIGNAL_SUFFIXES:
                return Landing(outcome, self.parser.begin(signal_read_ids, f.path))
            if f.kind is Kind.BASECALLS:
                return Landing(outcome, self.parser.begin(read_basecall_file, f.path, f.fmt, self.filt))
        return Landing(outcome)

    def take(self, landing: Landing) -> None:
        """The file into the ledger (waiting for its reading), the basecall cache or the end-of-run policy."""
        outcome = landing.outcome
        f = outcome.file
        if isinstance(outcome, Rejected):
            self._reject(outcome.file, outcome.size, outcome.mtime_ns, outcome.reason)
            return
        if f.kind is Kind.STOP:
            log.info("%s: stop file found", f.path)
            self.end.stop_file_found()
            return
        if f.kind is Kind.FINAL_SUMMARY:
            self._final_summary(f)
            return
        if f.kind is Kind.SIGNAL:
            self._register_signal(outcome, landing.read)
        else:
            self._register_basecalls(outcome, landing.read)

    def _final_summary(self, f: RunFile) -> None:
        """The run's end, with the files its summary counts (none if it cannot be read: the grace decides)."""
        try:
            written = files_written(f.path.read_text(errors="replace"))
        except OSError as exc:
            log.warning("%s: cannot read (%s); the run ends after the grace period", f.path, exc.strerror or exc)
            written = files_written("")
        expected = files_to_account(written.final_dest, self.layout.left_alone(f.run_root))
        counted = ", ".join(f"{n} {fmt}" for fmt, n in expected.items()) or "no file counts: the grace period applies"
        log.info("%s: run %s has finished writing (%s)", f.path, f.run_root, counted)
        if any(written.fallback.values()):
            log.warning("%s: the run wrote %s to MinKNOW's fallback folder, outside the run folder: their reads are "
                        "not seen", f.path, ", ".join(f"{n} {fmt} files" for fmt, n in written.fallback.items() if n))
        self.end.final_summary(f.run_root, time.monotonic(), expected)

    def _reject(self, f: RunFile, size: int, mtime_ns: int, reason: str) -> None:
        log.warning("%s: set aside: %s", f.path, reason)
        spares = [p for p in self.ledger.spare_files() if _stem(p) == _stem(f.path)] if f.fmt == "bam" else []
        used = self.ledger.reject_file(f.path, f.kind.value, f.fmt, size, mtime_ns, reason, spares)
        for spare, n in used.items():
            _log_fallback(spare, n, f"{f.path} could not be read ({reason})")

    def use_spares(self, why: str) -> None:
        """Reads no BAM record of which was read take their basecalls from the run's FASTQ (end of the run)."""
        used = self.ledger.use_spares()
        if used:
            log.warning("%d reads take their basecalls from FASTQ (%s): no BAM record of theirs was read %s",
                        sum(used.values()), ", ".join(str(p) for p in used), why)

    def _read(self, ready: Ready, reader: Callable[..., T], *args) -> T | None:
        """What `reader` gives for the file; None once the file is set aside because it failed.

        Only the reading is guarded: an error of the ledger itself is not the file's and goes on up.
        """
        f = ready.file
        try:
            return reader(*args)
        except Exception as exc:  # noqa: BLE001 - whatever a damaged file provokes in its reader
            if not os.path.lexists(f.path):
                reason = VANISHED
            elif isinstance(exc, InputError):
                reason = exc.reason
            else:
                log.debug("%s: %s", f.path, exc, exc_info=True)
                reason = f"cannot read: {one_line(exc)}"
            self._reject(f, ready.size, ready.mtime_ns, reason)
            return None

    def _register_signal(self, ready: Ready, read: Parsed[list[str]] | None) -> None:
        f = ready.file
        if read is None:  # not begun: a signal format this streamer does not read
            self._reject(f, ready.size, ready.mtime_ns, f"{f.fmt.upper()} signal files cannot be read by this "
                         f"streamer (it reads {', '.join(SIGNAL_SUFFIXES)})")
            return
        ids = self._read(ready, read.result)
        if ids is None:
            return
        reg = self.ledger.register_signal_file(f.path, f.fmt, ready.size, ready.mtime_ns, ids)
        _log_registered(f.path, "signal", reg)
        if reg.reopened_bams:
            self.on_reopened_bams(reg.reopened_bams)

    def _register_basecalls(self, ready: Ready, read: Parsed[dict[str, ReadBasecalls]]) -> None:
        f = ready.file
        reads = self._read(ready, read.result)
        if reads is None:
            return
        if f.spare:
            self._register_spare(ready, [(rid, bc.n_bases) for rid, bc in reads.items()])
            return
        reg = self.ledger.register_basecall_file(f.path, f.fmt, ready.size, ready.mtime_ns,
                                                 [(rid, bc.n_bases) for rid, bc in reads.items()])
        open_ids = self.ledger.open_reads_of(f.path)
        self.cache.add(bc for rid, bc in reads.items() if rid in open_ids)
        _log_registered(f.path, "basecalls", reg)
        if f.fmt == "bam":
            self.on_bam()

    def _register_spare(self, ready: Ready, reads: list[tuple[str, int]]) -> None:
        f = ready.file
        bad = [(p, why) for p, kind, why in self.ledger.rejected_files()
               if p.lower().endswith(".bam") and _stem(Path(p)) == _stem(f.path)]
        n = self.ledger.register_spare_file(f.path, f.fmt, ready.size, ready.mtime_ns, reads, use=bool(bad))
        log.debug("%s: %d reads (spare basecalls)", f.path, len(reads))
        if n:
            _log_fallback(f.path, n, f"{bad[0][0]} could not be read ({bad[0][1]})")
        elif f.run_root not in self._spare_runs:
            self._spare_runs.add(f.run_root)
            log.info("%s: basecalls come from the run's BAM files; its FASTQ is used only for reads whose BAM "
                     "record cannot be read", f.run_root)


class Landings:
    """The files the watcher reported, in order, their reading begun up to `ahead` files ahead; handed
    out a batch file at a time (`ready`): the files of one poll named alike, once each is read."""

    def __init__(self, intake: FileIntake, ahead: int):
        self.intake, self.ahead = intake, ahead
        self._polls = 0
        # keyed (poll, batch file of the poll): not begun yet, and begun
        self._waiting: deque[tuple[tuple[int, int], Ready | Rejected]] = deque()
        self._begun: deque[tuple[tuple[int, int], Landing]] = deque()

    def __bool__(self) -> bool:
        return bool(self._waiting or self._begun)

    def add(self, landed: list[Ready | Rejected]) -> None:
        """One poll's files, those of a batch file together, in the order the first of each landed."""
        self._polls += 1
        first: dict[str, int] = {}
        keyed = [(first.setdefault(_stem(o.file.path), len(first)), o) for o in landed]
        keyed.sort(key=lambda k: k[0])
        self._waiting.extend(((self._polls, group), o) for group, o in keyed)
        self._begin_more()

    def ready(self) -> list[Landing] | None:
        """The oldest batch file's files, once each is read; None while one is not."""
        if not self._begun:
            return None
        key = self._begun[0][0]
        n = next((i for i, (k, _) in enumerate(self._begun) if k != key), len(self._begun))
        if not all(landing.done() for _, landing in islice(self._begun, n)):  # a batch file is begun whole
            return None
        group = [self._begun.popleft()[1] for _ in range(n)]
        self._begin_more()
        return group

    def wait(self, timeout: float) -> None:
        """Until the oldest file begun is read, or `timeout` seconds."""
        if self._begun and self._begun[0][1].read is not None:
            self._begun[0][1].read.wait(timeout)

    def _begin_more(self) -> None:
        while self._waiting and (len(self._begun) < self.ahead or self._waiting[0][0] == self._begun[-1][0]):
            key, outcome = self._waiting.popleft()
            self._begun.append((key, self.intake.begin(outcome)))


def _stem(path: Path) -> str:
    """A run file's name without its format's suffixes: MinKNOW names a batch's POD5, FASTQ and BAM alike."""
    name = path.name.lower()
    for suffix in (".gz", ".bam", ".fastq", ".fq", ".fasta", ".fa", *SIGNAL_SUFFIXES):
        name = name.removesuffix(suffix)
    return name


def _log_fallback(spare: Path, n: int, why: str) -> None:
    log.warning(SPARE_USED, spare, n, why)


def _log_registered(path: Path, what: str, reg: Registered) -> None:
    log.debug("%s: %d reads (%d now have signal and basecalls)", path, reg.n_reads, reg.newly_matched)
    if reg.duplicates:
        log.warning("%s: %d reads already had %s from another file; these copies are ignored", path,
                    reg.duplicates, what)
    if reg.late:
        log.warning("%s: %d reads had already been reported without their %s; they are processed now "
                    "(skipped.tsv: reason %r)", path, reg.late, what, RECOVERED)
