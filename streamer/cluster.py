"""`streamer call --dask`: the batch plan made here, each batch read and computed on a Dask worker.

The client plans batches from the BAM (no signal is read here) and submits each as a task that
names its reads, their signal files and alignments. A worker reads the signal from the shared
filesystem, runs the stages on its own pipeline (on its GPU where it has one), renders the rows
with its own sinks, opened from the job's configuration as every host opens them
(`streamer.sinks.open_sinks`), and sends back text and counts only: no signal travels through
the scheduler. Results are
written in batch order, so the output is byte-identical to a local run.

A task whose worker dies is run again on another (Dask reschedules it); a task that raises is
tried once more, and if it fails again its reads are reported skipped (`Skip.WORKER_FAILED`)
like any bad read. Dask is an install extra (`streamer[cluster]`); this module imports it only
when a cluster is asked for.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamer.io.signal_chunks import load_signals
from streamer.pipeline.batching import Pending, batch_inputs, signal_requests
from streamer.errors import InputError, StreamerError
from streamer.pipeline.runner import BatchDriver
from streamer.pipeline.steps import Assembled, Done, Stages
from streamer.config import Config
from streamer.pipeline.stages import Pipeline, PipelineOptions
from streamer.sinks import SinkContext, open_sinks, row_sinks
from streamer.skips import Skip, Skipped
from streamer.summary import BatchOutcome

log = logging.getLogger(__name__)

# Fault injection for tests: the first task to find this file absent creates it and kills its worker.
KILL_ONCE_ENV = "STREAMER_FAULT_KILL_WORKER_ONCE"
IN_FLIGHT_PER_WORKER = 2  # batches queued on each worker, so none waits for the client between batches


@dataclass(frozen=True)
class ClusterJob:
    """What every task of a run shares; each worker opens it once (models, kernels, reference)."""

    options: PipelineOptions
    genome: str
    config: Config = field(default=Config(), hash=False)  # the workers' sinks, as the client's are opened
    context: SinkContext = field(default=SinkContext("call"), hash=False)
    analysis: str = "cpg"


_OPEN: dict[ClusterJob, tuple[Any, Any, Any]] = {}  # per worker process


def _opened(job: ClusterJob) -> tuple[Any, Any, Any]:
    if job not in _OPEN:
        from streamer import registry
        from streamer.io.reference import Reference

        pipeline = Pipeline(job.options, [registry.analysis(job.analysis)])
        rows = row_sinks(open_sinks(job.config, job.context))[0]  # the calls TSV
        _OPEN[job] = (pipeline, Reference(job.genome).__enter__(), rows)
    return _OPEN[job]


def run_batch(job: ClusterJob, pending: list[Pending], planned: list[Skipped]) -> Done:
    """One planned batch on a worker: its signal read, the stages, the rows rendered; no arrays go back."""
    pipeline, ref, sink = _opened(job)
    t0 = time.perf_counter()
    signals, errors = load_signals(signal_requests(pending))
    read = time.perf_counter() - t0
    marker = os.environ.get(KILL_ONCE_ENV)
    if marker and pending:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            os._exit(1)  # mid-batch, as a crash would
        except FileExistsError:
            pass
    reads, failed = batch_inputs(pending, signals, errors, ref)
    done = Stages(pipeline, sink.render, sink.count)(Assembled(reads, None, planned + failed,
                                                               len(planned) + len(pending)))  # fmt: skip
    done.outcome.timings["read"] = read
    return Done(done.outcome, rendered=done.rendered)


def _missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not os.path.exists(p)]


def dask_log_level(libraries: int, own: int) -> str:
    """Dask's own lines (nannies, scheduler, workers here), from the log levels of other libraries and of streamer:
    its errors by default, its warnings with -v (a busy machine has them about Dask's event loop, its garbage
    collection and, as a cluster closes, a worker's heartbeat with a traceback), its INFO with -vv."""
    return "info" if libraries <= logging.DEBUG else "warning" if own <= logging.DEBUG else "error"


def connect(address: str, threads: int) -> tuple[Any, int, Callable[[], None]]:
    """A Dask client for `address` (`tcp://host:8786`, or `local` / `local:N` for N worker processes
    here), how many workers it has, and what closes them (a local cluster with its client)."""
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", dask_log_level(logging.getLogger().getEffectiveLevel(),
                                                                      log.getEffectiveLevel()))  # fmt: skip
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise StreamerError("--dask needs Dask: pip install 'streamer[cluster]'") from None
    if address == "local" or address.startswith("local:"):
        n = int(address.partition(":")[2] or max(1, (os.cpu_count() or 1) // max(1, threads)))
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)

        def close() -> None:
            # the workers' processes end first: one that heartbeats to a scheduler already closing logs a
            # traceback. The scheduler forgets a worker before its process has ended (a busy machine showed
            # it), the cluster only once its nanny has closed it.
            cluster.scale(0)
            deadline = time.monotonic() + 30
            while cluster.workers and time.monotonic() < deadline:
                time.sleep(0.05)
            client.close()
            cluster.close()

        return client, n, close
    try:
        client = Client(address, timeout="30s")
    except (OSError, TimeoutError) as exc:
        raise StreamerError(f"--dask {address}: cannot reach the scheduler ({exc})") from None
    return client, max(1, len(client.scheduler_info()["workers"])), client.close


def check_paths(client: Any, paths: Iterable[Path]) -> None:
    """Every worker must see the inputs on its filesystem: one line naming a worker and a file it cannot see."""
    wanted = [str(Path(p).resolve()) for p in paths]
    for worker, missing in sorted(client.run(_missing, wanted).items()):
        if missing:
            raise InputError(missing[0], f"not visible on Dask worker {worker} (workers read inputs from a "
                             f"shared filesystem; {len(missing)} of {len(wanted)} paths missing there)")  # fmt: skip


def run_on_cluster(client: Any, workers: int, job: ClusterJob,
                   plans: Iterable[tuple[int, list[Pending], list[Skipped]]],
                   on_done: Callable[[Done], None]) -> None:  # fmt: skip
    """Every planned (batch number, pending, skipped) through a worker; batches handed back in order."""
    driver = BatchDriver(lambda done: done, limit=max(1, workers * IN_FLIGHT_PER_WORKER))
    try:
        for done in driver.run(_Task(client, job, pending, planned) for _, pending, planned in plans):
            on_done(done)
    finally:
        driver.close()


class _Task:
    """A batch as a Dask task: submitted when the driver has room, its outcome waited for in order."""

    def __init__(self, client: Any, job: ClusterJob, pending: list[Pending], planned: list[Skipped]):
        self.client, self.job, self.pending, self.planned = client, job, pending, planned
        self.future: Any = None

    def start(self) -> None:
        self.future = self.client.submit(run_batch, self.job, self.pending, self.planned, retries=1, pure=False)

    def assemble(self) -> Done:
        from distributed import KilledWorker

        try:
            return self.future.result()
        except KilledWorker as exc:
            return _failed(self.pending, self.planned, f"its workers died ({exc})")
        except Exception as exc:  # noqa: BLE001 - the task's own error, after its retry
            return _failed(self.pending, self.planned, f"{type(exc).__name__}: {exc}")


def _failed(pending: list[Pending], planned: list[Skipped], why: str) -> Done:
    log.warning("a batch of %d reads failed twice on the cluster: %s", len(pending), why)
    skipped = [Skipped(p.aln.read_id, Skip.WORKER_FAILED, f"batch failed twice on the cluster: {why}")
               for p in pending]  # fmt: skip
    return Done(BatchOutcome(len(planned) + len(pending), skipped=planned + skipped))
