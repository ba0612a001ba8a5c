"""Watching a run folder: each file the run writes handed on once it is complete, or rejected with why.

A file is handed on ("ready") exactly when it is complete:
- POD5, BLOW5 and BAM as soon as their last bytes hold the format's end marker;
- other formats after a close or move event, or, where no event can tell (start-up scan,
  polling), once unchanged for `settle` seconds; and then only if complete by their own test:
  gzip (FASTQ.gz) decompresses to the trailer of its last member, plain text ends with a
  newline, a FAST5 opens (retried with back-off: HDF5 refuses to open a file another process
  is still writing).
A file that stays unchanged and incomplete for `incomplete_timeout` seconds is rejected with
the reason (truncated, corrupt); if it changes later it is looked at again. A file that cannot
be read at all (permission denied, a symbolic link that loops or leads nowhere) is rejected
once settled, and one that disappears before it is handed on is rejected as `VANISHED`: every
file the watcher meets ends in an outcome the daemon records.

watchdog's observer thread only enqueues paths; every check runs on the caller's thread in
`Watcher.poll`, so a slow check never stalls event delivery.
"""

from __future__ import annotations

import logging
import os
import queue
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from streamer.daemon.runfolder import Kind, RunFile, RunLayout, Verdict, check_complete, tail_marked

log = logging.getLogger(__name__)

# watchdog's recursive inotify may add a watch twice for a folder made and filled at once (MinKNOW's and
# replay's staging folders) and warns that it replaces the first; the folder stays watched, so a user
# would see a page of watchdog's internals for nothing
warnings.filterwarnings("ignore", r"Callback with id .* already exists", RuntimeWarning, r"watchdog\.")

VANISHED = "vanished (deleted or moved away) before it was read"


# ---------------------------------------------------------------------------- the watcher


@dataclass(frozen=True)
class Ready:
    """A complete file, with the size and modification time it was checked at."""

    file: RunFile
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Rejected:
    """A file set aside: truncated or corrupt, with the reason."""

    file: RunFile
    size: int
    mtime_ns: int
    reason: str


@dataclass(frozen=True)
class _Raw:
    path: str
    announced: bool  # a close-after-write or move-in: the writer is done with it
    is_dir: bool = False
    gone: bool = False


@dataclass
class _Candidate:
    file: RunFile
    size: int = -1
    mtime_ns: int = -1
    changed_at: float = 0.0
    announced: bool = False
    checked: tuple[int, int] | None = None
    next_check: float = 0.0
    attempts: int = 0
    reason: str = ""


class _Handler(FileSystemEventHandler):
    """Runs on watchdog's dispatcher thread: only enqueues."""

    def __init__(self, q: queue.SimpleQueue, use_modified: bool):
        self._q = q
        self._use_modified = use_modified

    def on_created(self, event: FileSystemEvent) -> None:
        self._q.put(_Raw(_text(event.src_path), False, event.is_directory))

    def on_modified(self, event: FileSystemEvent) -> None:
        if self._use_modified and not event.is_directory:
            self._q.put(_Raw(_text(event.src_path), False))

    def on_closed(self, event: FileSystemEvent) -> None:
        self._q.put(_Raw(_text(event.src_path), True))

    def on_moved(self, event: FileSystemEvent) -> None:
        self._q.put(_Raw(_text(event.src_path), False, event.is_directory, gone=True))
        self._q.put(_Raw(_text(event.dest_path), True, event.is_directory))

    def on_deleted(self, event: FileSystemEvent) -> None:
        self._q.put(_Raw(_text(event.src_path), False, event.is_directory, gone=True))


def _text(p: str | bytes) -> str:
    return os.fsdecode(p)


@dataclass(frozen=True)
class WatchTimings:
    """How long the watcher waits: the `watch.*` keys of the configuration, where their defaults live."""

    poll_interval: float
    settle: float
    incomplete_timeout: float
    max_backoff: float = 30.0  # the longest wait before a FAST5 that would not open is tried again


class Watcher:
    """Turns file-system events and a start-up scan into `Ready` and `Rejected` files.

    `known(path, size, mtime_ns)` lets the caller (the ledger) skip files it has already
    dealt with, before any check reads them.
    """

    def __init__(self, layout: RunLayout, timings: WatchTimings, *, poll: bool = False,
                 known: Callable[[Path, int, int], bool] = lambda p, s, m: False,
                 clock: Callable[[], float] = time.monotonic):
        self.layout = layout
        self.timings = timings
        self._poll = poll
        self._known = known
        self._clock = clock
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._candidates: dict[Path, _Candidate] = {}
        self._outcomes: list[Ready | Rejected] = []  # decided while taking events, handed on by `poll`
        self._observer = None
        self.run_roots: set[Path] = set()
        self.last_activity = clock()

    # -- lifecycle

    def start(self) -> None:
        """Start the observer, then scan: a file closed in between is seen by one or the other."""
        if self._observer is not None:
            return
        if self._poll:
            observer = PollingObserver(timeout=self.timings.poll_interval)
        else:
            observer = Observer()
        observer.schedule(_Handler(self._q, use_modified=self._poll), str(self.layout.root), recursive=True)
        observer.start()
        self._observer = observer
        self.scan(self.layout.root)

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()
            self._observer = None

    def __enter__(self) -> "Watcher":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what is pending

    @property
    def pending(self) -> list[Path]:
        """Files seen but not complete yet."""
        return sorted(self._candidates)

    def scan(self, top: Path) -> None:
        paths = [Path(d) / f for d, _, files in os.walk(top) for f in files]
        self.layout.note_listing(paths)
        for p in sorted(paths):
            self._see(p, announced=False)

    # -- the work, on the caller's thread

    def poll(self, timeout: float) -> list[Ready | Rejected]:
        """Wait up to `timeout` s for events, then check what is due; the files that are settled."""
        try:
            first = self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
        except queue.Empty:
            first = None
        raws = [first] if first is not None else []
        while True:
            try:
                raws.append(self._q.get_nowait())
            except queue.Empty:
                break
        for raw in raws:
            self._take(raw)
        out, self._outcomes = self._outcomes, []
        return out + self._check_due()

    def reject_pending(self, why: str) -> list[Ready | Rejected]:
        """Give up on every incomplete file (end of run): each is rejected with its last reason."""
        out, self._outcomes = self._outcomes, []
        for path, c in sorted(self._candidates.items()):
            reason = c.reason or "never completed"
            out.append(Rejected(c.file, c.size, c.mtime_ns, f"{reason} ({why})"))
        self._candidates.clear()
        return out

    def _take(self, raw: _Raw) -> None:
        path = Path(raw.path)
        if raw.gone:
            c = self._candidates.pop(path, None)
            if c is not None:
                self._outcomes.append(Rejected(c.file, c.size, c.mtime_ns, VANISHED))
            return
        if raw.is_dir:
            if path.is_dir():  # made or moved in with files already inside
                self.scan(path)
            return
        self._see(path, raw.announced)

    def _see(self, path: Path, announced: bool) -> None:
        c = self._candidates.get(Path(os.path.abspath(path)))
        if c is None:
            f = self.layout.classify(path)
            if f is None:
                return
            self.run_roots.add(f.run_root)
            try:
                st = f.path.stat()
            except OSError as exc:
                self._unstattable(f, exc)
                return
            if self._known(f.path, st.st_size, st.st_mtime_ns):
                return
            now = self._clock()
            age = max(0.0, time.time() - st.st_mtime_ns / 1e9)
            c = _Candidate(f, st.st_size, st.st_mtime_ns, changed_at=now - age, next_check=now)
            self._candidates[f.path] = c
            log.debug("new file %s (%s, %s)", f.path, f.kind.value, f.fmt)
        self.last_activity = self._clock()
        if announced:
            if not self._restat(c):
                del self._candidates[c.file.path]
                return
            c.announced = True
            c.next_check = self._clock()
            c.attempts = 0

    def _unstattable(self, f: RunFile, exc: OSError) -> None:
        """A file seen that cannot be looked at: gone already, or a link that loops or leads nowhere.

        Recorded once (`known` asks the ledger), by what the link itself says of its size and time.
        """
        try:
            st = os.lstat(f.path)
        except OSError:
            if not self._known(f.path, 0, 0):
                self._outcomes.append(Rejected(f, 0, 0, VANISHED))
            return
        if not self._known(f.path, st.st_size, st.st_mtime_ns):
            what = "a broken symbolic link" if isinstance(exc, FileNotFoundError) else exc.strerror or str(exc)
            self._outcomes.append(Rejected(f, st.st_size, st.st_mtime_ns, f"cannot read ({what})"))

    def _restat(self, c: _Candidate) -> bool:
        """Refresh size and mtime; False if the file cannot be looked at any more."""
        try:
            st = c.file.path.stat()
        except OSError as exc:
            self._unstattable(c.file, exc)
            return False
        if (st.st_size, st.st_mtime_ns) != (c.size, c.mtime_ns):
            c.size, c.mtime_ns = st.st_size, st.st_mtime_ns
            c.changed_at = self._clock()
            c.announced = False
            c.attempts = 0
            self.last_activity = c.changed_at
        return True

    def _check_due(self) -> list[Ready | Rejected]:
        out: list[Ready | Rejected] = []
        now = self._clock()
        t = self.timings
        for path in [p for p, c in self._candidates.items() if c.next_check <= now]:
            c = self._candidates[path]
            if not self._restat(c):
                del self._candidates[path]
                continue
            outcome = self._evaluate(c, now)
            if outcome is not None:
                del self._candidates[path]
                out.append(outcome)
                continue
            if c.attempts:
                c.next_check = now + min(t.poll_interval * 2 ** (c.attempts - 1), t.max_backoff)
            else:
                c.next_check = now + t.poll_interval
        return out

    def _evaluate(self, c: _Candidate, now: float) -> Ready | Rejected | None:
        t = self.timings
        f = c.file
        if f.kind is Kind.STOP:
            return Ready(f, c.size, c.mtime_ns)
        settled = c.announced or now - c.changed_at >= t.settle
        if not (settled or tail_marked(f.fmt)):
            return None
        sig = (c.size, c.mtime_ns)
        if sig != c.checked or f.fmt == "fast5":
            verdict, reason = check_complete(f.path, f.fmt)
            c.checked = sig
            if verdict is Verdict.COMPLETE:
                return Ready(f, c.size, c.mtime_ns)
            if verdict is Verdict.CORRUPT and settled:
                return Rejected(f, c.size, c.mtime_ns, reason)
            c.reason = reason
            c.attempts += 1
        if settled and now - c.changed_at >= t.incomplete_timeout:
            waited = now - c.changed_at
            return Rejected(f, c.size, c.mtime_ns, f"{c.reason}; unchanged for {waited:.0f} s")
        return None
