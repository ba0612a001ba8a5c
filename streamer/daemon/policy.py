"""The daemon's decisions, with no files, threads or clocks of their own: what to do next.

`streamer.daemon.shell` is the I/O shell around these: it reads the clock, the watcher and the
ledger, asks here whether a batch is due, whether the run is over, whether reads waited too
long for their partner file, and what a batch's outcome is per read and in counters; then it
does what the answer says (reads, calls, appends, commits). Times are seconds on whatever
clock the caller passes, the same clock throughout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streamer.skips import Skip, Skipped
from streamer.summary import PIPELINE_ERROR, BatchOutcome, tally

CALLED = "called"
ALL_FILES_IN = "final_summary, every file it counts accounted for"
RECOVERED = "recovered"  # a skipped.tsv row, not an outcome: an earlier missing-partner row no longer holds


@dataclass(frozen=True)
class Ending:
    """Why the loop stopped, and whether the run itself is over."""

    reason: str
    run_over: bool


def batch_due(n_matched: int, full: bool, files_pending: bool, oldest_wait: float, max_wait: float,
              stages_busy: bool = False) -> bool:  # fmt: skip
    """A full batch goes at once; a partial one when no file is on its way and the stages are free for
    it (while they are busy with batches before it, it grows instead), or once its oldest read has
    waited `max_wait`."""
    return n_matched > 0 and (full or (not files_pending and not stages_busy) or oldest_wait >= max_wait)


def files_to_account(final_dest: Mapping[str, int], left_alone: Mapping[str, int]) -> dict[str, int]:
    """How many files of each format the daemon must have accounted for: what a run's final_summary
    says it wrote into its folder, less those the daemon does not read by choice."""
    return {fmt: max(0, n - left_alone.get(fmt, 0)) for fmt, n in final_dest.items()}


@dataclass
class EndOfRun:
    """When a run is over: a STOP file; every run folder's `final_summary` and, where it counts the
    files the run wrote, every one of them accounted for (registered or set aside), else once
    `grace` of quiet has passed (the upper bound either way); or `idle_timeout` with no new file
    (0: never). With `follow`, only a STOP file ends it."""

    grace: float
    idle_timeout: float
    follow: bool = False
    stop_file: str = "STOP"
    finals: dict[Path, float] = field(default_factory=dict)  # run folder -> when its final_summary was seen
    expected: dict[Path, dict[str, int]] = field(default_factory=dict)  # run folder -> files to account, by format
    stop_file_seen: bool = False

    def final_summary(self, run_root: Path, now: float, expected: Mapping[str, int] | None = None) -> None:
        """`expected`: `files_to_account` of its counts; None when it has none (the grace decides)."""
        self.finals[run_root] = now
        if expected:
            self.expected[run_root] = dict(expected)
        else:
            self.expected.pop(run_root, None)

    def stop_file_found(self) -> None:
        self.stop_file_seen = True

    def counting(self) -> list[Path]:
        """Run folders whose files are counted: the caller passes `check` how many it accounted for."""
        return sorted(self.expected)

    def check(self, now: float, last_activity: float, run_roots: Collection[Path], files_pending: bool,
              accounted: Mapping[Path, Mapping[str, int]] | None = None) -> Ending | None:  # fmt: skip
        """`accounted`: the files of each of `counting()`'s run folders accounted for, by format."""
        if self.stop_file_seen:
            return Ending(f"{self.stop_file} file", run_over=True)
        if self.follow:
            return None
        quiet = now - last_activity
        roots = set(run_roots) | set(self.finals)
        if self.finals and roots <= set(self.finals):
            if not files_pending and all(self._all_in(r, (accounted or {}).get(r)) for r in self.finals):
                return Ending(ALL_FILES_IN, run_over=True)
            since = min(now - max(self.finals.values()), quiet)
            if since >= self.grace:
                return Ending("final_summary", run_over=True)
        if self.idle_timeout and quiet >= self.idle_timeout and not files_pending:
            return Ending(f"no new file for {self.idle_timeout:g} s", run_over=True)
        return None

    def _all_in(self, run_root: Path, accounted: Mapping[str, int] | None) -> bool:
        expected = self.expected.get(run_root)
        return expected is not None and accounted is not None and \
            all(accounted.get(fmt, 0) >= n for fmt, n in expected.items())


@dataclass
class JoinTimeout:
    """When to look for reads that waited `timeout` for their partner file: not before `timeout`
    has passed since the start (files found at start-up were all registered at once), then every
    tenth of it, between 1 s and a minute."""

    timeout: float
    started: float
    next_check: float = 0.0

    def due(self, now: float) -> bool:
        if now < self.next_check or now - self.started < self.timeout:
            return False
        self.next_check = now + min(max(self.timeout / 10, 1.0), 60.0)
        return True


def missing_partner(waiting: Iterable[tuple[str, bool, Path]], when: str) -> list[Skipped]:
    """(read id, has its signal, the file it has) of reads whose partner never came, as skips."""
    out = []
    for read_id, has_signal, path in waiting:
        if has_signal:
            out.append(Skipped(read_id, Skip.NO_BASECALL, f"signal in {path}; no basecalls {when}"))
        else:
            out.append(Skipped(read_id, Skip.NO_SIGNAL, f"basecalls in {path}; no signal {when}"))
    return out


@dataclass(frozen=True)
class ReadOutcomes:
    """Each read's outcome ("called", a skip label or "pipeline error"), the reads called, the batch's counters."""

    outcomes: list[tuple[str, str]]
    called: set[str]
    counters: Counter


def account(read_ids: Sequence[str], input_ids: Sequence[str], stage_skipped: Sequence[Skipped],
            outcome: BatchOutcome) -> ReadOutcomes:  # fmt: skip
    """Each of `read_ids` (a batch's reads, each once) as it ended, from the batch's `outcome`:
    `input_ids` are its records that reached the stages (one per record), `stage_skipped` those
    of them the stages skipped.

    A read is called when at least one of its records came through; otherwise its outcome is its
    first record's reason (a read the pipeline failed on alone: "pipeline error"). The counters
    are the outcome's (`streamer.summary.tally`) and the reads called.
    """
    going = Counter(rid for rid in input_ids if rid not in outcome.failed)
    going.subtract(s.read_id for s in stage_skipped)
    called = {rid for rid, n in going.items() if n > 0}
    first_skip: dict[str, str] = dict.fromkeys(outcome.failed, PIPELINE_ERROR)
    for s in outcome.skipped:
        first_skip.setdefault(s.read_id, s.reason.label)
    outcomes = [(rid, CALLED if rid in called else first_skip.get(rid, CALLED)) for rid in read_ids]
    counters = tally(outcome)
    counters["reads_called"] = len(called)
    return ReadOutcomes(outcomes, called, counters)


def skip_counters(skipped: Sequence[Skipped]) -> Counter:
    """Counters of records that end skipped without reaching a batch (missing partner files)."""
    counters = Counter({"records_in": len(skipped)})
    counters.update(f"skipped.{s.reason.label}" for s in skipped)
    return counters


def skip_row(read_id: str, reason: str, detail: str) -> str:
    """A skipped.tsv row."""
    detail = detail.replace("\t", " ").replace("\n", " ")
    return f"{read_id}\t{reason}\t{detail}\n"


def recovered_row(read_id: str, superseded: str, signal_path: Path, basecall_path: Path) -> str:
    """The row that supersedes a read's earlier missing-partner row, written with its outcome."""
    late_file = signal_path if superseded == Skip.NO_SIGNAL.label else basecall_path
    return skip_row(read_id, RECOVERED, f"reported '{superseded}' earlier; {late_file} landed later and the read "
                                        "was processed with it (this row replaces that report)")
