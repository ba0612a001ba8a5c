"""The daemon's I/O shell: files land, reads are joined, batched, called, written exactly once.

What to do next (a batch due, the end of the run, reads past the join timeout, each read's
outcome and the counters) is decided in `streamer.daemon.policy`, with no files or threads;
this module reads the clock, the watcher and the ledger, asks, and acts. Files the watcher
reports complete go through `streamer.daemon.intake`.

The engine thread does all the work in one loop: take the files the watcher reports complete,
register them in the ledger (which joins signal and basecalls by read id), hand a batch to the
batch driver `streamer call` uses (`streamer.pipeline.runner`, jobs from `streamer.daemon.batches`)
when one is due, append the rows of the batches it hands back (in the order they went in), commit
the ledger, and check whether the run is over. Several batches are in flight, as many as the
driver holds for `streamer call` with `pipeline.compute_threads` (within the memory budget): one
is read while others are assembled and computed, so the GPU is not left waiting on the host; a
partial batch grows while the stages are busy. The signal of the next matched reads (one batch at
most) is read ahead on the reader pool `streamer call` uses
(`streamer.pipeline.signal_pool.SignalReads`). Nothing in flight is committed, so a crash loses nothing.
The main thread only supervises (`streamer.daemon.supervise`): it feeds systemd's watchdog while
the engine makes progress, sends status, and on SIGTERM (which only sets an event) waits at most
`drain_timeout` for the batches in hand (those in the stages; the others are dropped, uncommitted).

A run ends on a `final_summary*.txt` in every run folder once every file it counts is in the
ledger (registered or set aside), or a grace period after it; on an idle timeout; or on a STOP
file. Then every matched read is processed, every read still missing its partner is recorded as
such, and the derived outputs are written. SIGTERM does not end the run: reads not done stay
open in the ledger for the next start.

Outputs are sinks opened from the configuration (`streamer.daemon.sink_set`): the rows of the
row sinks (`meth.tsv`, `eventalign.tsv`) are appended to the journal with the commit; the others
take each committed batch as records after it. summary.json is made in `streamer.daemon.report`.

One module, past the size the others keep to, because it is the daemon's one place of I/O and order: every
decision is already elsewhere (`policy`, `intake`, `batches`, `sink_set`, `report`), and what is left (the
loop's steps and the order of append, commit and hand-off that makes a batch exactly-once) reads as one piece.
It is over 450 lines because the lifecycle, the engine's loop and the batch transaction share the
daemon's state (ledger, driver, flights, sinks): its decisions are already in `policy`.
"""

from __future__ import annotations

import enum
import logging
import os
import sqlite3
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from streamer.daemon.aligner import ReadAligner
from streamer.pipeline.batch import ReadInput
from streamer.config import Config
from streamer.daemon.batches import Aligning, DaemonBatch, basecalls_of, eventalign_of, picked, signal_wanted
from streamer.daemon.intake import FileIntake, Landings
from streamer.daemon.policy import (PIPELINE_ERROR, EndOfRun, Ending, JoinTimeout, account, batch_due,
                                    missing_partner, recovered_row, skip_counters, skip_row)  # fmt: skip
from streamer.errors import StreamerError
from streamer.io.alignments import AlignmentFilter
from streamer.io.reference import Reference
from streamer.io.signal import SIGNAL_SUFFIXES
from streamer.daemon.basecall_cache import BasecallCache, read_basecall_file
from streamer.daemon.ledger import BatchRecord, Ledger, Pick, Waiting
from streamer.daemon import report
from streamer.daemon.notify import Notifier
from streamer.daemon.journal import SKIPPED_HEADER, Journal
from streamer.publish.sink import PublishSink, PublisherLike
from streamer.pipeline import timeline
from streamer.pipeline.runner import BatchDriver, RunnerOptions
from streamer.pipeline.steps import Done, Stages
from streamer.pipeline.parsing import ParseProcess
from streamer.pipeline.signal_pool import SignalReads, signal_readers
from streamer.daemon.sink_set import EVENTALIGN, SinkSet
from streamer.daemon.supervise import supervise
from streamer.skips import Skipped
from streamer.tuning.session import AutoTuner
from streamer.daemon.runfolder import RunLayout
from streamer.daemon.watch import Watcher, WatchTimings

log = logging.getLogger(__name__)

SKIPPED_TSV = "skipped.tsv"
# Files read ahead of the ledger in the parsing process (`streamer.daemon.intake.Landings`): two batch files'
# POD5, BAM and FASTQ keep it busy; each read BAM waits in /dev/shm (about 10 MB for 1,000 reads).
LANDINGS_AHEAD = 6
# One parsing process, busy with each batch file's four reads in turn, made files wait 4.0 s on average
# at 24 Mbases/s on the GPU box against 1.6 s when the engine read some of them itself
PARSE_WORKERS = 3


class BatchResultLike(Protocol):
    """What the daemon needs of `streamer.pipeline.stages.BatchResult`."""

    batch: Any
    read_ids: Sequence[str]
    ref_names: Sequence[str]
    skipped: Sequence[Skipped]
    n_bases: int
    timings: dict[str, float]
    products: Mapping[str, Any]  # "calls": `MethCalls`; "eventalign": rows, when eventalign is on


class PipelineLike(Protocol):
    """What the daemon needs of `streamer.pipeline.stages.Pipeline` (models loaded, kernels warm)."""

    def process(self, reads: list[ReadInput]) -> BatchResultLike: ...


@dataclass
class Flight:
    """A batch the engine handed to the driver: its reads, its job, when it was picked (monotonic)."""

    picks: list[Pick]
    job: DaemonBatch
    started: float


class State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    FINISHING = "finishing"  # the run is over: the last batches and the unmatched reads
    FINISHED = "finished"
    STOPPED = "stopped"  # left by SIGTERM; open reads wait for the next start
    FAILED = "failed"


class Daemon:
    """`start()`, then `run()` (blocks; returns the exit status), then `close()`."""

    def __init__(self, config: Config, pipeline: PipelineLike, reference: Reference, *,
                 make_aligner: Callable[[], ReadAligner] | None = None,
                 publisher: PublisherLike | None = None, notifier: Notifier | None = None,
                 tuner: AutoTuner | None = None, published_on: dict[str, Any] | None = None,
                 profile: dict[str, Any] | None = None):
        self.config = config
        self.pipeline = pipeline
        self.tuner = tuner  # sees each batch's GPU measurements; its caps K and B apply from the next batch
        self.profile = profile  # the device profile and the limits it set (`Plan.as_dict`), for summary.json
        self.reference = reference
        self.publisher = publisher
        self.published_on = published_on  # the publisher's bound addresses, for summary.json
        self.notifier = notifier or Notifier({})
        self.aligning = Aligning(make_aligner)
        self._filter = AlignmentFilter(min_mapq=config.alignment.min_mapq, secondary=config.alignment.secondary)
        self._stop = threading.Event()
        self._stop_why = "SIGTERM"  # the signal that asked for the stop, for the log
        self._engine: threading.Thread | None = None
        self._heartbeat = time.monotonic()
        self.started_at = time.time()
        self.started = time.monotonic()
        self.state = State.NEW
        self.ending: Ending | None = None
        self.failure: BaseException | None = None
        self.abandoned = False  # SIGTERM's drain timeout passed with a batch still in hand
        self.ledger: Ledger | None = None
        self.outputs: Journal | None = None
        self.watcher: Watcher | None = None
        self.intake: FileIntake | None = None
        self.landings: Landings | None = None  # files landed, read ahead, not yet in the ledger
        self.signal: SignalReads | None = None
        self.sinks = SinkSet([])  # opened with the ledger (`start`), from the configuration
        self.driver: BatchDriver | None = None  # the batches in flight, handed back in order
        self._flights: deque[Flight] = deque()  # what the engine submitted, oldest first
        # landed files, off the stages' GIL: a batch file's POD5 ids, BAM, FASTQ and the modkit sink's pass at once
        self.parser = ParseProcess(config.pipeline.io_mode != "threads", workers=PARSE_WORKERS)
        self.cache = BasecallCache(config.join.max_pending_bases, self._filter,
                                   lambda *file: self.parser.run(read_basecall_file, *file))
        end = config.end
        self.end = EndOfRun(end.final_summary_grace, end.idle_timeout, end.follow, end.stop_file)
        self.join_timeout = JoinTimeout(config.join.timeout, self.started)
        self._next_refresh = 0.0
        self._next_status = 0.0
        self._status: dict[str, Any] = {}
        self.publish = PublishSink(publisher) if publisher is not None else None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open (and repair) state and outputs, index the reference, start watching. Idempotent."""
        if self.state is not State.NEW:
            return
        cfg = self.config
        try:
            self.ledger = Ledger(cfg.state_dir(), watch_dir=cfg.watch.dir)
            self.sinks = SinkSet.open(cfg, self.ledger, self.publish, self._beat, self.parser.begin)
            headers = self.sinks.headers() | {SKIPPED_TSV: SKIPPED_HEADER}
            self.outputs = Journal(cfg.output.dir, headers, self.ledger.offsets())
            if self.outputs.fresh:
                self.ledger.commit((), self.outputs.fresh, {})
            self.sinks.load(self.outputs.path, self._beat)
            if cfg.watch.basecalls != "bam":
                self.aligning.build()
            exclude = [cfg.output.dir, cfg.state_dir(), cfg.reference.genome]
            layout = RunLayout(cfg.watch.dir, stop_file=cfg.end.stop_file, include_fail=cfg.watch.include_fail,
                            basecalls=cfg.watch.basecalls, exclude=tuple(exclude))
            timings = WatchTimings(cfg.watch.poll_interval, cfg.watch.settle, cfg.watch.incomplete_timeout)
            self.intake = FileIntake(self.ledger, self.cache, self._filter, self.end, layout,
                                     lambda bams: self.sinks.each("on_reopened", bams),
                                     lambda: self.sinks.each("on_file", "basecalls", "bam"), self.parser)
            self.landings = Landings(self.intake, LANDINGS_AHEAD)
            self.watcher = Watcher(layout, timings, poll=cfg.watch.poll, known=self.ledger.is_known)
            self.watcher.start()
            workers = cfg.pipeline.threads or os.cpu_count() or 1
            pool = signal_readers(SIGNAL_SUFFIXES, workers, cfg.pipeline.io_mode) if cfg.batch.read_ahead else None
            self.signal = SignalReads(pool)
            threads = cfg.pipeline.compute_threads
            runner = RunnerOptions(compute_threads=threads, ahead=2 if threads > 1 else 1)  # as `memory_plan` sizes
            stages = Stages(self.pipeline, self.sinks.render, self.sinks.count, isolate=True,
                            keep_signal=self.sinks.needs_signal, keep_events=self.sinks.needs_events)  # fmt: skip
            self.driver = BatchDriver(stages.compute, compute_threads=threads, limit=runner.limit, front=stages.front,
                                      prepare=stages.prepare, finish=stages.finish)
        except BaseException:
            self.close()
            raise
        self.state = State.RUNNING
        self._refresh_status()
        log.info("watching %s (%s); outputs in %s; state in %s", cfg.watch.dir,
                 "polling" if cfg.watch.poll else "inotify", cfg.output.dir, cfg.state_dir())
        self._send("run", "start", {"watch_dir": str(cfg.watch.dir), "output_dir": str(cfg.output.dir)})

    def request_stop(self, why: str = "SIGTERM") -> None:
        """SIGTERM (or SIGINT, `why`): stop taking files, finish the batches in the stages, flush, exit. Safe from a
        signal handler."""
        self._stop_why = why
        self._stop.set()

    def run(self) -> int:
        """Run until the run is over or a stop is requested; 0 unless the engine failed."""
        self.start()
        self.notifier.ready(self.status_line())
        self._engine = threading.Thread(target=self._engine_main, name="streamer-engine", daemon=True)
        self._engine.start()
        self.abandoned = supervise(self._engine, self._stop, self.notifier, self.config.service, self.stalled,
                                   self.status_line)
        if self.abandoned:
            return 0
        self.notifier.stopping(self.status_line())
        return 1 if self.failure is not None else 0

    def stalled(self, timeout: float) -> bool:
        """The engine has made no progress for `timeout` seconds (systemd's watchdog is then left to fire)."""
        return time.monotonic() - self._heartbeat >= timeout

    def close(self) -> None:
        """Release everything (waits for the engine, so call it after `run` unless abandoning)."""
        if self._engine is not None:
            self._stop.set()
            self._engine.join()
        for part in (self.watcher, self.driver, self.signal, self.parser, self.outputs, self.sinks, self.ledger,
                     self.notifier):  # fmt: skip
            if part is not None:
                part.close()

    # ------------------------------------------------------------------ the engine

    def _engine_main(self) -> None:
        try:
            self.ending = self._loop()
            self._finish(self.ending)
        except BaseException as exc:
            self.failure = exc
            self.state = State.FAILED
            bug = not isinstance(exc, (StreamerError, OSError, sqlite3.OperationalError))  # a full disk: one line
            log.critical("daemon failed: %s", exc, exc_info=bug or bool(os.environ.get("STREAMER_DEBUG")))
            self._fail_summary()
            self._send("run", "end", {"state": self.state.value, "error": str(exc)})

    def _fail_summary(self) -> None:
        """summary.json with the failure, first and into the space held for it (the disk may be full),
        then the tables if they still fit."""
        try:
            if self.outputs is not None:
                self.outputs.release_reserve()
            report.write_summary(self.config.output.dir, report.summary(self))
            self._refresh(final=True)
        except Exception as again:  # noqa: BLE001 - the state itself may be what failed
            log.error("cannot write the outputs after the failure: %s", again)

    def _beat(self) -> None:
        self._heartbeat = time.monotonic()

    def _loop(self) -> Ending:
        while True:
            self._beat()
            if self._stop.is_set():
                return Ending(f"stop requested ({self._stop_why})", run_over=False)
            # a full batch, one in flight or a file being read waits for no new file
            idle = not self._flights and not self._picks()[1] and not self.landings
            self.landings.add(self.watcher.poll(0.25 if idle else 0.0))
            self._take_landed()
            self._submit_due(self._files_pending)
            if self._flights:
                self._harvest(0.05)
            else:
                self.landings.wait(0.05)
            self._time_out_waiting()
            self._refresh_if_due()
            if time.monotonic() >= self._next_status:
                self._refresh_status()
            accounted = {root: self.ledger.files_under(root) for root in self.end.counting()}
            ending = self.end.check(time.monotonic(), self.watcher.last_activity, self.watcher.run_roots,
                                    self._files_pending, accounted)  # fmt: skip
            if ending is not None:
                return ending

    @property
    def _files_pending(self) -> bool:
        """Files the watcher has seen that are not yet in the ledger."""
        return bool(self.watcher.pending) or bool(self.landings)

    def _take_landed(self, wait: bool = False) -> None:
        """The landed files read so far into the ledger, a batch file at a time (`wait`: every one landed);
        between batch files, the full batches start and those done commit. A stop ends it: no batch starts after."""
        while self.landings and not self._stop.is_set():
            group = self.landings.ready()
            if group is None:
                if not wait:
                    return
                self._beat()
                self.landings.wait(1.0)
                continue
            for landing in group:
                with timeline.span("intake"):  # a landed file's reads into the ledger (`--trace`)
                    self.intake.take(landing)
                self._beat()
            self._submit_due(True)
            self._harvest(0.0)

    def _finish(self, ending: Ending) -> None:
        log.info("run loop ended: %s", ending.reason)
        if ending.run_over:
            self.state = State.FINISHING
            self.notifier.stopping(f"run over ({ending.reason}): finishing")
            self._take_landed(wait=True)
            for rejected in self.watcher.reject_pending("still incomplete when the run ended"):
                self.intake.take(self.intake.begin(rejected))
            self.intake.use_spares("by the end of the run")
            while not self._stop.is_set():
                self._beat()
                self._submit_due(files_pending=False)
                if not self._flights:
                    break
                self._harvest(1.0)
        if self._stop.is_set():  # the batches in the stages are finished; those not yet in them wait for a restart
            self.driver.halt()
        while self._flights and self.driver.oldest_coming:
            self._beat()
            self._harvest(1.0)
        self._flights.clear()
        if ending.run_over and not self._stop.is_set():
            self._close_waiting(self.ledger.waiting(), "by the end of the run")
            self.state = State.FINISHED
        if self.state is not State.FINISHED:
            self.state = State.STOPPED
        self._refresh(final=True)
        self._send("run", "end", {"state": self.state.value, "reason": ending.reason, **self._status})
        log.info("%s", self.status_line())

    # ------------------------------------------------------------------ batches

    def _picks(self) -> tuple[list[Pick], bool]:
        """The next batch's reads: the oldest matched reads not in a batch in flight."""
        after = self._flights[-1].picks[-1] if self._flights else None
        return self.ledger.matched(self.config.batch.max_reads, self.config.batch.max_bases, after=after)

    def _submit_due(self, files_pending: bool) -> None:
        """Hand the driver every batch that is due while it has room (see `batch_due`)."""
        while self.driver.has_room:
            picks, full = self._picks()
            busy = len(self._flights) >= self.driver.compute_threads
            if not picks or not batch_due(len(picks), full, files_pending, time.time() - picks[0].matched,
                                          self.config.batch.max_wait, busy):  # fmt: skip
                return
            self._submit(picks)

    def _submit(self, picks: list[Pick]) -> None:
        """One batch to the driver: its basecalls taken, aligned where they came without, its signal begun."""
        t0 = time.monotonic()
        with timeline.span("basecalls", reads=len(picks)):
            picks, found, failed = basecalls_of(picks, self.cache, self.ledger)
        unaligned = [(rid, bc.seq) for rid, bc in found.items() if bc.records is None]
        for rid, records in self.aligning.align(unaligned).items():
            found[rid] = replace(found[rid], records=records)
        signal = self.signal.take(signal_wanted(picks, found))
        job = DaemonBatch(picks, *picked(picks, found, failed), signal, self.reference)
        self.driver.submit(job)
        self._flights.append(Flight(picks, job, t0))
        if self.signal.pool is not None:  # the next batch's signal is read while this one waits and computes
            self.signal.ahead(signal_wanted(self._picks()[0]))

    def _harvest(self, timeout: float) -> None:
        """Commit the batches done, in the order they were submitted (the first waited for up to `timeout`)."""
        while self._flights and (done := self.driver.take_ready(timeout)) is not None:
            self._commit_batch(self._flights.popleft(), done)
            timeout = 0.0

    def _commit_batch(self, flight: Flight, done: Done) -> None:
        """A batch through the stages: append, commit; each read ends called or with its reasons."""
        picks, job = flight.picks, flight.job
        outcome, results = done.outcome, done.results
        if len(results) == 1 and not outcome.failed:
            self._tune(results[0])
        eventalign = self.sinks.eventalign
        aligned = eventalign_of(self.sinks.eventalign_texts(done.rendered), results, eventalign.labels, EVENTALIGN) \
            if eventalign is not None else []
        skip_rows = [recovered_row(p.read_id, p.superseded, p.signal_path, p.basecall_path)
                     for p in picks if p.superseded]
        skip_rows += [skip_row(s.read_id, s.reason.label, s.detail) for s in outcome.skipped]
        skip_rows += [skip_row(rid, PIPELINE_ERROR, why) for rid, why in outcome.failed.items()]
        for s in outcome.skipped:
            log.debug("%s", s.message())
        done_at = time.time()
        read = account([p.read_id for p in picks], job.input_ids,
                       [s for r in results for s in r.skipped], outcome)  # fmt: skip
        counters = read.counters
        counters["eventalign_rows"] = sum(len(rows) for rows, _, _, _ in aligned)
        latencies = [max(0.0, done_at - p.matched) for p in picks]
        batch = BatchRecord(len(picks), counters["records_in"], outcome.calls, counters["bases"],
                            time.monotonic() - flight.started, sum(latencies), max(latencies))
        with timeline.span("commit", reads=len(picks)):
            self._commit(read.outcomes, self.sinks.texts(done.rendered), skip_rows, counters, batch, results)
        if self.publish is not None:
            self.publish.on_batch(results, (columns for rows_, batch_, labels, text in aligned
                                            for columns in eventalign.messages(rows_, batch_, labels, text)))
        log.info("batch of %d reads: %d calls, %d records skipped, %.2f s", len(picks), outcome.calls,
                 len(outcome.skipped), batch.seconds)

    def _tune(self, result: BatchResultLike) -> None:
        """The batch's GPU measurements to the tuner (batches of the end-of-run drain count as the last)."""
        stats = getattr(result, "gpu_stats", None)
        if self.tuner is None or stats is None:
            return
        if self.tuner.observe(stats, last=self.state is State.FINISHING):
            s = self.tuner.settings
            batch = replace(self.config.batch, max_reads=s.max_reads, max_bases=s.max_bases)
            self.config = replace(self.config, batch=batch)

    def _commit(self, outcomes: list[tuple[str, str]], texts: Mapping[str, str], skip_rows: list[str],
                counters: Counter, batch: BatchRecord | None, results: Sequence[BatchResultLike] = ()) -> None:
        """Append, flush, then commit: the order that makes output exactly-once; then the derived outputs
        (the frequency table changes before its `meth.freq` update is published, as `serve_sites` requires).
        `texts`: each row sink's rows, by its journal file."""
        lines = {name: [text] if text else [] for name, text in texts.items()} | {SKIPPED_TSV: skip_rows}
        with timeline.span("journal"):  # the parts of a commit, for `--trace`
            offsets = self.outputs.append(lines)
        with timeline.span("ledger"):
            self.ledger.commit(outcomes, offsets, counters, batch)
        with timeline.span("sinks"):
            for r in results:
                self.sinks.each("on_batch", r)
        with timeline.span("status"):
            self._refresh_status()  # heartbeats and the metrics carry the counts as committed
            self._send("status", self._status)

    def _time_out_waiting(self) -> None:
        """Reads that waited `join.timeout` for their partner are recorded as missing it."""
        if not self.join_timeout.due(time.monotonic()):
            return
        timeout = self.join_timeout.timeout
        overdue = self.ledger.waiting(since_before=time.time() - timeout)
        if overdue:
            log.warning("%d reads waited more than %g s for their partner file", len(overdue), timeout)
            self._close_waiting(overdue, f"within {timeout:g} s")

    def _close_waiting(self, waiting: list[Waiting], when: str) -> None:
        if not waiting:
            return
        skipped = missing_partner(((w.read_id, w.has_signal, w.path) for w in waiting), when)
        self.cache.discard(w.read_id for w in waiting)
        self._commit([(s.read_id, s.reason.label) for s in skipped], {},
                     [skip_row(s.read_id, s.reason.label, s.detail) for s in skipped], skip_counters(skipped), None)
        log.warning("%d reads recorded as missing their partner file (%s)", len(skipped), when)

    # ------------------------------------------------------------------ outputs and status

    def _send(self, what: str, *args: Any) -> None:
        if self.publish is not None:
            self.publish.send(what, *args)

    def _refresh_if_due(self) -> None:
        if time.monotonic() >= self._next_refresh:
            self._refresh()

    def _refresh(self, final: bool = False) -> None:
        """Rewrite meth-freq.tsv and meth.bed (if changed) and summary.json; publish status."""
        self._next_refresh = time.monotonic() + self.config.output.refresh_interval
        self.sinks.each("refresh", final)
        self._refresh_status()
        self._send("status", self._status)

    def _refresh_status(self) -> None:
        """The counts behind the STATUS line, the publisher's status and summary.json (which `streamer status
        OUTDIR` reads), as of the last commit: a small file, unlike the tables `_refresh` rewrites."""
        self._next_status = time.monotonic() + self.config.service.status_interval
        summary = report.summary(self)
        self._status = report.status(summary, len(self.watcher.pending) if self.watcher else 0)
        report.write_summary(self.config.output.dir, summary)

    @property
    def status(self) -> dict[str, Any]:
        """The counts as of the last commit or status refresh (`streamer.metrics.status_of`); any thread."""
        return self._status

    def status_line(self) -> str:
        return report.status_line(self.state.value, self._status)
