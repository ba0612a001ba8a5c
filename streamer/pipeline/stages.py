"""The stage chain over one batch: the one chain `streamer call`, `eventalign` and `run` drive.

    events -> method-of-moments scaling -> ABEA -> recalibration and QC -> analyses

The first four stages are the core's (`CORE_STAGES`); the analyses after them (the CpG
caller, eventalign) come from plugins through `streamer.registry` and are handed to
`Pipeline`. Each stage is a numba kernel over the batch's flat arrays that releases the GIL
and runs in parallel over reads; it reads the batch record's fields, writes its own, and
sets the `Skip` code of the reads it fails, which later stages pass over. An analysis keeps
what it made in `batch.products[its name]`.

One module, past the size the others keep to, because what it holds is one thing: the stages' protocol, the
core's four stages, and the `Pipeline` that runs them on a batch's lane, ahead on the front thread or in turn,
with the GPU lanes it opens for them and the warm-up that proves each lane. Split, each part would import the
others' private choices (which stage runs ahead, which lane a stage's part is on).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ContextManager, Protocol

import numba
import numpy as np

from streamer.pipeline import timeline
from streamer.pipeline.abea import align_batch
from streamer.pipeline.chunks import chunked
from streamer.pipeline.batch import ReadBatch, ReadInput, pack, synthetic_read
from streamer.pipeline.devices import DevicePool
from streamer.pipeline.events import detect_events, reverse_events
from streamer.pipeline.gpu import (LANE_SWITCH_INTERVAL, AbeaBatchStats, CudaOptions, GpuAbea, GpuEvents, HmmBatchStats,
                                  gpu_package)
from streamer.pipeline.chemistry import DEFAULT, Chemistry
from streamer.pore.model import PoreModel, load_kmer_model
from streamer.pore.motifs import CPG, Motif
from streamer.pipeline.postalign import recalibrate_batch
from streamer.pipeline.scaling import estimate_scalings
from streamer.skips import Skip, Skipped

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineOptions:
    threads: int = os.cpu_count() or 1
    kmer_model: Path | None = None
    meth_model: Path | None = None
    cuda: CudaOptions = CudaOptions()
    chemistry: Chemistry = DEFAULT  # its event, ABEA and recalibration settings (the models are given above)
    motif: Motif = CPG  # the sites the methylation caller scores; `meth_model` is a model of its modified base


@dataclass
class GpuDevice:
    """One lane of a GPU: ABEA, the analyses' GPU parts (by stage name), the lock they take turns on.

    A GPU has `CudaOptions.lanes` of them, each with its own arena, buffers and stream: batches on
    different lanes run their GPU stages at once, batches on one lane take turns.

    `context` makes the device current on the calling thread for one batch (numba's
    `cuda.gpus[dev_id]`; a no-op for the fakes of the tests).
    """

    dev_id: int
    abea: GpuAbea  # streamer_gpu.abea.CudaAbea, or any object with its `align`
    context: Callable[[], ContextManager] = contextlib.nullcontext
    parts: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class GpuGroup:
    """Every GPU's ABEA stage as one (`streamer.tuning.session.GpuStage`): a retune reaches each device.

    The options are the first device's; each device keeps its own device number.
    """

    def __init__(self, devices: list[GpuDevice]):
        self.devices = devices

    @property
    def options(self) -> CudaOptions:
        return self.devices[0].abea.options

    def retune(self, options: CudaOptions) -> None:
        for device in self.devices:
            device.abea.retune(replace(options, dev_id=device.dev_id))


class Stage(Protocol):
    """One step of the chain. `open` runs once, before the warm-up batch (models, devices).

    A stage with GPU work opens its part on each of `pipeline.devices` into `device.parts[name]`
    and uses `pipeline.device`'s (None: this batch, or this part of it, runs on the CPU). A leading
    stage may also say `ahead`: True where it needs no lane of its batch's, so `Pipeline.front` may run
    it ahead on the pipeline's front lane (`Pipeline.front_device`, whose parts it opens too), or on the
    CPU before it is opened, while the pipeline starts (`Pipeline.start`); a stage without it never runs
    ahead. A later stage may have a `prepare(batch, pipeline)`: the part of its work that needs none of the
    stages before it, run on the CPU after the leading stages wherever they run ahead; the stage itself then
    takes what it left (or does that part itself where nothing ran ahead).
    """

    name: str  # its key in the batch's stage timings (and in `batch.products` for an analysis)
    chunk: int  # reads handed to a thread at a time

    def open(self, pipeline: Pipeline) -> None: ...

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None: ...


class _CoreStage:
    chunk = 1  # reads differ in length by orders of magnitude: hand them out one at a time

    def open(self, pipeline: Pipeline) -> None:
        pass

    ahead = False  # whether it needs no lane of the batch's GPU (`Stage`)


class DetectEvents(_CoreStage):
    """Event detection, on the GPU when `cuda.events` asks for it (its measurements in `batch.stats["events"]`):
    ahead of the GPU stages on the front lane's part, or on the batch's lane where it runs every stage."""

    name = "events"
    ahead = True

    def open(self, pipeline: Pipeline) -> None:
        if not pipeline.options.cuda.events:
            return
        for device in [*pipeline.devices, *([pipeline.front_device] if pipeline.front_device else [])]:
            part = gpu_package().open_events(replace(pipeline.options.cuda, dev_id=device.dev_id))
            if part is not None:
                device.parts[self.name] = part

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        device, params = pipeline.device, pipeline.options.chemistry.events
        gpu: GpuEvents | None = device.parts.get(self.name) if device is not None else None
        if gpu is None:
            events = detect_events(batch.signal, batch.signal_off, params, batch.event_spread)
        else:
            with device.lock:
                events, batch.stats[self.name] = gpu.detect(batch.signal, batch.signal_off, params, batch.event_spread)
        batch.ev_off, batch.ev_start, batch.ev_length, batch.ev_mean, batch.ev_stdv = events


class EstimateScalings(_CoreStage):
    """Method-of-moments scalings. Direct RNA as f5c 1.6 takes it: the read's U read as T before, the
    events turned 5'->3' after (the moments do not depend on the events' order, their float sums do)."""

    name = "scaling"
    ahead = True

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        chem = pipeline.options.chemistry
        if chem.u_to_t:
            batch.seq[batch.seq == ord("U")] = ord("T")
        batch.shift, batch.scale, batch.var = estimate_scalings(
            batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.status, pipeline.kmer_model
        )
        if chem.reverse_signal:
            reverse_events(batch.ev_off, batch.ev_start, batch.ev_length, batch.ev_mean, batch.ev_stdv)


class AlignEvents(_CoreStage):
    """ABEA, on the GPU when the pipeline has one (its measurements in `batch.stats["abea"]`)."""

    name = "abea"

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        device, params = pipeline.device, pipeline.options.chemistry.abea
        if device is None:
            aln = align_batch(batch, pipeline.kmer_model, params)
        else:
            with device.lock:
                aln, batch.stats[self.name] = device.abea.align(batch, pipeline.kmer_model, params)
        batch.aln_off, batch.aln_kmer, batch.aln_event = aln.aln_off, aln.aln_kmer, aln.aln_event


class Recalibrate(_CoreStage):
    """Shift, scale and var from the alignment, and QC; the method-of-moments values are kept."""

    name = "postalign"

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        post = recalibrate_batch(batch, pipeline.kmer_model, pipeline.options.chemistry.postalign)
        batch.post = post
        batch.mom_scalings = (batch.shift, batch.scale, batch.var)
        batch.shift, batch.scale, batch.var = post.shift, post.scale, post.var


CORE_STAGES: tuple[type[_CoreStage], ...] = (DetectEvents, EstimateScalings, AlignEvents, Recalibrate)


@dataclass
class BatchResult:
    """One batch after the chain: the batch record (with each analysis's products), the reads that
    gave nothing and why, and stage times."""

    batch: ReadBatch
    skipped: list[Skipped]
    timings: dict[str, float]

    @property
    def read_ids(self) -> list[str]:
        return self.batch.read_ids

    @property
    def ref_names(self) -> list[str]:
        return self.batch.ref_names

    @property
    def n_reads(self) -> int:
        return self.batch.n

    @property
    def n_bases(self) -> int:
        return self.batch.n_bases

    @property
    def products(self) -> dict[str, Any]:
        return self.batch.products

    @property
    def gpu_stats(self) -> AbeaBatchStats | None:
        """The GPU ABEA stage's measurements, when it ran."""
        return self.batch.stats.get("abea")

    @property
    def hmm_stats(self) -> HmmBatchStats | None:
        """The GPU HMM's measurements, when it ran."""
        return self.batch.stats.get("hmm")


class Pipeline:
    """Models loaded and kernels compiled once; then `run_batch` batch after batch.

    `analyses` are the stages after the core's, in order. Batches may run on several threads
    at once (`streamer call` overlaps them). Each batch takes the least loaded of `devices`
    (`options.cuda.lanes` lanes per GPU of `options.cuda.devices`; none when ABEA runs on the CPU)
    for all its GPU stages, whose device buffers serve one batch at a time and so take turns on the
    lane's lock.

    A CUDA error (device out of memory included) never loses a read: at start-up (the warm-up
    batch, where a GPU another process filled first runs out) it drops that GPU, with one line,
    and the process runs on the others or the CPU; in a batch, the stage that raised it and the
    rest of that batch run on the CPU, with one line, and the next batch tries the GPU again.
    """

    def __init__(self, options: PipelineOptions = PipelineOptions(), analyses: list[Stage] | tuple[Stage, ...] = (),
                 start: bool = True):  # fmt: skip
        self.options = options
        self.kmer_model: PoreModel = load_kmer_model(options.kmer_model)  # any k; a caller checks its own model
        self.stages: list[Stage] = [stage() for stage in CORE_STAGES] + list(analyses)
        numba.set_num_threads(max(1, min(options.threads, numba.config.NUMBA_NUM_THREADS)))
        self.pool: DevicePool[GpuDevice] = DevicePool([])
        self._front: GpuDevice | None = None
        self.gpu_lock = threading.Lock()  # for a GPU part set from outside (tests, benchmarks) with no device
        self._local = threading.local()
        self._started = threading.Event()
        self._start_failed = False
        self.warm_up_result: BatchResult | None = None
        """The synthetic read's result, which a host renders to compile its sinks' kernels (the calls TSV)."""
        if start:
            self.start()

    def start(self) -> None:
        """The GPUs' arenas, buffers and kernels' modules, each stage opened, and the warm-up, once.

        A host may start the batches' reads first (`Pipeline(start=False)`) and start the pipeline on its
        own thread while they go on, since the start-up is mostly Python holding the GIL: until it is done
        `run_batch` waits, and `front` runs the ahead stages on the CPU (or waits, for events on the GPU).
        """
        try:
            with timeline.span("devices"):  # the GPUs' arenas, buffers and kernels' modules
                self.pool = DevicePool(open_devices(self.options.cuda))
            if self.devices:
                sys.setswitchinterval(min(sys.getswitchinterval(), LANE_SWITCH_INTERVAL))
            for stage in self.stages:
                stage.open(self)
            with timeline.span("warm-up"):
                self.warm_up_result = self._warm_up()
        except BaseException:
            self._start_failed = True
            raise
        finally:
            self._started.set()

    def _wait_started(self) -> None:
        self._started.wait()
        if self._start_failed:
            raise RuntimeError("the pipeline did not start")

    @property
    def devices(self) -> list[GpuDevice]:
        return self.pool.devices

    @property
    def front_device(self) -> GpuDevice | None:
        """The first GPU's lane for the stages run ahead (`front`): parts of its own, its own lock."""
        if self._front is None and self.devices:
            self._front = replace(self.devices[0], parts={}, lock=threading.Lock())
        return self._front

    @property
    def gpu(self) -> GpuGroup | None:
        """The GPUs' ABEA stages as the tuner retunes them, or None when ABEA runs on the CPU."""
        return GpuGroup(self.devices) if self.devices else None

    @property
    def device(self) -> GpuDevice | None:
        """The GPU the calling thread's batch runs on, or None where it runs on the CPU."""
        return getattr(self._local, "device", None)

    def analysis(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def process(self, reads: list[ReadInput]) -> BatchResult:
        return self.run_batch(pack(reads))

    def front(self, batch: ReadBatch) -> None:
        """The leading stages that need no lane (`ahead`: event detection, scaling), run now on the calling
        thread, on `front_device`, and marked in `batch.ran`, which `run_batch` goes on after: so one
        batch's events run while another's GPU stages do (the driver's front thread). Nothing where there
        is no GPU to overlap. Before `start` is done, on the CPU where a GPU may come (the events on the
        GPU wait for it)."""
        cuda = self.options.cuda
        if not self._started.is_set() and not cuda.disable and not cuda.events:
            self._ahead(batch, None)
            return
        self._wait_started()
        front = self.front_device
        if front is None:
            return
        with front.context():
            self._ahead(batch, front)

    def _ahead(self, batch: ReadBatch, device: GpuDevice | None) -> None:
        """The leading `ahead` stages, then the later stages' `prepare`s (`Stage`, timed as `<stage> ahead`)."""
        leading = 0
        for stage in self.stages:
            if not getattr(stage, "ahead", False):
                break
            leading += 1
            self._local.device = device
            try:
                self._ran_ahead(stage.name, batch, lambda: self._call(stage, batch))
            finally:
                self._local.device = None
        for stage in self.stages[leading:]:
            if (prepare := getattr(stage, "prepare", None)) is not None:
                self._ran_ahead(f"{stage.name} ahead", batch, lambda: prepare(batch, self))

    def _ran_ahead(self, name: str, batch: ReadBatch, run: Callable[[], None]) -> None:
        t0, c0 = time.perf_counter(), timeline.thread_cpu()
        run()
        t1 = time.perf_counter()
        batch.ran[name] = t1 - t0
        timeline.record(name, t0, t1, reads=batch.n, stats=batch.stats.get(name), cpu=timeline.thread_cpu() - c0)

    def run_batch(self, batch: ReadBatch) -> BatchResult:
        self._wait_started()
        i = self.pool.take()
        try:
            return self._run(batch, None if i is None else self.devices[i], recover=True)
        finally:
            self.pool.give(i)

    def _run(self, batch: ReadBatch, device: GpuDevice | None, recover: bool) -> BatchResult:
        timings: dict[str, float] = dict(batch.ran)
        with device.context() if device is not None else contextlib.nullcontext():
            for stage in self.stages:
                if stage.name in batch.ran:
                    continue
                t0, c0 = time.perf_counter(), timeline.thread_cpu()
                self._local.device = device
                try:
                    self._call(stage, batch)
                except Exception as exc:
                    if device is None or not recover or not is_cuda_error(exc):
                        raise
                    log.warning("GPU %d failed in the %s stage of a batch of %d reads (%s): the rest of the batch "
                                "runs on the CPU", device.dev_id, stage.name, batch.n, exc)  # fmt: skip
                    device = self._local.device = None
                    self._call(stage, batch)
                finally:
                    self._local.device = None
                t1 = time.perf_counter()
                timings[stage.name] = timings.get(stage.name, 0.0) + t1 - t0
                timeline.record(stage.name, t0, t1, reads=batch.n, stats=batch.stats.get(stage.name),
                                cpu=timeline.thread_cpu() - c0)  # fmt: skip
        abea = batch.stats.get("abea")
        if isinstance(abea, AbeaBatchStats):  # what the tuner judges its split by
            batch.stats["abea"] = replace(abea, t_batch=sum(timings.values()))
        return BatchResult(batch, skipped_of(batch), timings)

    def _call(self, stage: Stage, batch: ReadBatch) -> None:
        with chunked(stage.chunk):
            stage(batch, self)

    def _warm_up(self) -> BatchResult:
        """Compile (or load from cache) every kernel on a synthetic read before real data arrives, on each GPU."""
        failed = False
        result = None
        for i in reversed(range(len(self.devices))):
            dev_id = self.devices[i].dev_id
            try:
                result = self._run(pack([self._synthetic_read()]), self.devices[i], recover=False)
            except Exception as exc:
                if not is_cuda_error(exc):
                    raise
                self.pool.drop(i)
                if self._front is not None and self._front.dev_id == dev_id:
                    self._front = None  # the next GPU's, without parts: events ahead on the CPU
                where = "batches go to the other GPUs" if self.devices else "this process runs on the CPU"
                log.warning("GPU %d failed at start-up (%s): %s", dev_id, exc, where)
                failed = True
        if failed:
            gpu_package().release_gpu()
        if not self.devices:
            result = self._run(pack([self._synthetic_read()]), None, recover=False)
        return result

    def _synthetic_read(self) -> ReadInput:
        return synthetic_read(self.kmer_model, reverse=self.options.chemistry.reverse_signal)


def open_devices(cuda: CudaOptions) -> list[GpuDevice]:
    """The GPU ABEA stage on each of cuda's devices that has one to give (each failure said in one line), in
    `cuda.lanes` lanes each where the device holds them: the first lane of every GPU, then the second..., so
    that the least loaded lane spreads batches over the GPUs first."""
    if cuda.disable:
        return []
    gpu = gpu_package()
    firsts = []
    for dev_id in cuda.devices(gpu.count_gpus()):
        abea = gpu.open_gpu(replace(cuda, dev_id=dev_id))
        if abea is not None:
            firsts.append(GpuDevice(dev_id, abea, gpu.device_context(dev_id)))
    devices = list(firsts)
    for lane in range(1, cuda.lanes):
        for first in firsts:
            if lane < first.abea.lanes and (abea := gpu.open_lane(first.abea)) is not None:
                devices.append(GpuDevice(first.dev_id, abea, first.context))
    return devices


def is_cuda_error(exc: BaseException) -> bool:
    """A failed launch, copy, allocation or module load on a GPU (asked only where a GPU stage ran)."""
    return gpu_package().is_cuda_error(exc)


def skipped_of(batch: ReadBatch) -> list[Skipped]:
    """The batch's records the stages failed, with their reasons."""
    return [
        Skipped(batch.read_ids[i], Skip(int(batch.status[i])), f"signal from {batch.signal_paths[i]}")
        for i in np.flatnonzero(batch.status != Skip.OK).tolist()
    ]

