"""Every GPU of a host: batches go to the least loaded device, results come back in input order
(fake devices: several GPUs are not at hand, and the choice is the same for any device object)."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from streamer.pipeline import planned
from streamer.pipeline.runner import RunnerOptions
from streamer.pipeline.steps import Stages
from streamer.pipeline.abea import align_batch
from streamer.pipeline.batch import pack
from streamer.pipeline.events import detect_events
from streamer.pipeline.devices import DevicePool
from streamer.pipeline.gpu import LANE_SWITCH_INTERVAL, AbeaBatchStats, CudaOptions
from streamer.io.reference import Reference
from streamer.pipeline.stages import GpuDevice, Pipeline, PipelineOptions
from streamer.summary import RunSummary
from streamer_plugins.cpg.caller import CpgCaller
from conftest import ECOLI, REFERENCE
from streamer.pipeline.batching import BatchLimits, plan_batches
from streamer.io.alignments import AlignmentFilter, AlignmentRecord, iter_alignments
from streamer.io.fastx import load_basecalls
from streamer.io.index import open_index


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """The fixture's reads planned one to a batch."""
    reads = tmp_path_factory.mktemp("devices") / "reads.fasta"
    reads.write_bytes((ECOLI / "reads.fasta").read_bytes())
    filt = AlignmentFilter()
    wanted = {a.read_id for a in iter_alignments(ECOLI / "reads.bam", filt) if isinstance(a, AlignmentRecord)}
    index = open_index(reads, [ECOLI / "fast5"])
    return list(plan_batches(iter_alignments(ECOLI / "reads.bam", filt), load_basecalls(reads, wanted), index,
                             BatchLimits(1), "r"))  # fmt: skip


def test_the_least_loaded_device_takes_the_batch_lowest_index_first():
    pool = DevicePool(["gpu0", "gpu1", "gpu2"])
    assert [pool.take() for _ in range(4)] == [0, 1, 2, 0]
    pool.give(1)
    pool.give(2)
    assert pool.take() == 1  # loads (2, 0, 0)
    assert pool.take() == 2
    assert pool.load == [2, 1, 1] and pool.batches == [2, 2, 2]
    pool.drop(0)
    assert pool.devices == ["gpu1", "gpu2"] and pool.take() == 0


def test_no_device_no_choice():
    pool = DevicePool([])
    assert pool.take() is None
    pool.give(None)


def test_device_lists_and_all():
    base = CudaOptions()
    assert base.devices(4) == (0,)
    assert base.with_devices("2").devices(4) == (2,)
    assert base.with_devices("0,1").devices(4) == (0, 1) and base.with_devices("0,1").dev_id == 0
    assert base.with_devices("all").devices(3) == (0, 1, 2)
    for bad in ("-1", "0,0", "x", ""):
        with pytest.raises(ValueError):
            base.with_devices(bad)


class FakeAbea:
    """A device's ABEA that aligns on the CPU, once `parties` batches are in flight on the devices at once."""

    def __init__(self, dev_id: int, meeting: threading.Barrier, seen: list):
        self.dev_id, self.meeting, self.seen = dev_id, meeting, seen

    def align(self, *args):
        self.meeting.wait(timeout=60)
        self.seen.append(self.dev_id)
        return align_batch(*args), None


class FakeEvents:
    """A lane's GPU events part that detects on the CPU and records which lane it is."""

    def __init__(self, name: str, used: list):
        self.name, self.used = name, used

    def detect(self, signal, signal_off, params, spread=True):
        self.used.append(self.name)
        return detect_events(signal, signal_off, params, spread), None


class MeasuredAbea(FakeAbea):
    """A device's ABEA that reports its measurements, as the GPU's does."""

    def align(self, *args):
        aln, _ = super().align(*args)
        return aln, AbeaBatchStats(1, 600, 512, None, 1, 0, 0, 0, 0, 0, 0.5, 0.5, 0.0, 0.01, 0.0, 0.0, 0.01, 0.0, 0.0,
                                   0, t_wall=0.02)  # fmt: skip


def test_a_batch_s_measurements_carry_the_seconds_of_all_its_stages_for_the_tuner():
    """The tuner judges a change of the split by the batch's stages, front ones included (the reads it sends
    to the CPU take their cores), not the ABEA stage's own wall time, which stays as measured."""
    pipeline = Pipeline(PipelineOptions(threads=1, cuda=CudaOptions(disable=True)), [CpgCaller()])
    pipeline.pool = DevicePool([GpuDevice(0, MeasuredAbea(0, threading.Barrier(1), []))])
    pipeline.devices[0].parts["events"] = pipeline.front_device.parts["events"] = FakeEvents("lane", [])
    batch = pack([pipeline._synthetic_read()])
    pipeline.front(batch)
    result = pipeline.run_batch(batch)
    assert {"events", "scaling", "abea", "hmm"} <= result.timings.keys()
    assert result.gpu_stats.t_batch == pytest.approx(sum(result.timings.values())) and result.gpu_stats.t_batch > 0
    assert result.gpu_stats.t_wall == 0.02


def test_events_run_ahead_on_the_front_lanes_own_part():
    """With a GPU, `front` runs a batch's events on a lane of their own (the first GPU's, with its own
    parts and lock), so they take no batch's lane, and the caller's motif sites; a batch not run ahead uses its
    lane's part and finds its sites itself, to the same calls."""
    pipeline = Pipeline(PipelineOptions(threads=1, cuda=CudaOptions(disable=True)), [CpgCaller()])
    pipeline.pool = DevicePool([GpuDevice(d, FakeAbea(d, threading.Barrier(1), [])) for d in range(2)])
    used: list = []
    for device in pipeline.devices:
        device.parts["events"] = FakeEvents(f"lane {device.dev_id}", used)
    front = pipeline.front_device
    assert front.dev_id == 0 and front.parts == {} and front.lock is not pipeline.devices[0].lock
    front.parts["events"] = FakeEvents("front", used)
    ahead = pack([pipeline._synthetic_read()])
    pipeline.front(ahead)
    assert set(ahead.ran) == {"events", "scaling", "hmm ahead"} and used == ["front"]
    assert "hmm.sites" in ahead.products  # the caller's sites, found ahead of the batch's ABEA
    result = pipeline.run_batch(ahead)
    assert "hmm.sites" not in result.products and "hmm ahead" in result.timings
    behind = pipeline.run_batch(pack([pipeline._synthetic_read()]))
    assert used == ["front", "lane 0"]
    assert np.array_equal(result.batch.ev_mean, behind.batch.ev_mean)
    assert result.products["calls"].llr.tobytes() == behind.products["calls"].llr.tobytes()


def test_before_its_start_a_pipeline_runs_the_ahead_stages_on_the_cpu_and_computes_once_started(monkeypatch):
    """`call` starts the pipeline while the first batches are read: until then `front` runs their events
    and scalings on the CPU (a GPU may come), and `run_batch` waits; the results are a started one's."""
    monkeypatch.setattr("streamer.pipeline.stages.open_devices", lambda cuda: [])  # no GPU, simulated or not
    options = PipelineOptions(threads=1)
    started = Pipeline(options, [CpgCaller()])
    pipeline = Pipeline(options, [CpgCaller()], start=False)
    assert pipeline.warm_up_result is None
    early = pack([pipeline._synthetic_read()])
    pipeline.front(early)
    assert set(early.ran) == {"events", "scaling", "hmm ahead"}
    got: list = []
    computing = threading.Thread(target=lambda: got.append(pipeline.run_batch(early)))
    computing.start()
    computing.join(0.2)
    assert computing.is_alive() and not got  # it waits for the start, however long that takes
    pipeline.start()
    computing.join(60)
    expected = started.run_batch(pack([started._synthetic_read()]))
    assert pipeline.warm_up_result is not None and len(got) == 1
    for name in ("ev_mean", "aln_off", "aln_kmer", "aln_event", "shift", "scale"):
        assert np.array_equal(getattr(got[0].batch, name), getattr(expected.batch, name))
    assert got[0].products["calls"].llr.tobytes() == expected.products["calls"].llr.tobytes()
    later = pack([pipeline._synthetic_read()])
    pipeline.front(later)
    assert not later.ran  # started, with no GPU: nothing to overlap, nothing runs ahead


def test_the_warm_up_takes_no_batch_of_a_devices_count(monkeypatch):
    """`batches_on_gpuN` in `call`'s summary is the pool's count alone: its batches may start before the
    start-up is over, so nothing can be taken off it afterwards."""
    monkeypatch.setattr("streamer.pipeline.stages.open_devices",
                        lambda cuda: [GpuDevice(0, FakeAbea(0, threading.Barrier(1), []))])  # fmt: skip
    pipeline = Pipeline(PipelineOptions(threads=1), start=False)
    monkeypatch.setattr("sys.setswitchinterval", lambda s: switched.append(s))
    switched: list[float] = []
    pipeline.start()
    assert switched == [LANE_SWITCH_INTERVAL]  # its lanes get the GIL back soon after each CUDA call
    assert pipeline.pool.batches == [0]
    pipeline.run_batch(pack([pipeline._synthetic_read()]))
    assert pipeline.pool.batches == [1]


def test_batches_spread_over_n_devices_and_results_in_input_order(plans):
    n = 3
    work = plans[: n * (len(plans) // n)]
    assert len(work) >= 2 * n
    options = PipelineOptions(threads=1, cuda=CudaOptions(disable=True))
    alone = Pipeline(options, [CpgCaller()])
    spread = Pipeline(options, [CpgCaller()])
    meeting, seen = threading.Barrier(n), []
    spread.pool = DevicePool([GpuDevice(d, FakeAbea(d, meeting, seen)) for d in range(n)])

    def run(pipeline: Pipeline, threads: int) -> list:
        got: list = []

        def got_batch(done) -> None:
            got.extend(done.results)

        with Reference(REFERENCE) as ref, ThreadPoolExecutor(2) as pool:
            planned.run_batches(pipeline, iter(work), ref, pool, RunSummary(),
                                     got_batch,
                                     options=RunnerOptions(compute_threads=threads, ahead=n))  # fmt: skip
        return got

    expected, ours = run(alone, 1), run(spread, n)
    # n batches in flight at once each took a device of its own: every device did its share
    assert sorted(seen) == sorted(list(range(n)) * (len(work) // n))
    assert spread.pool.batches == [len(work) // n] * n and spread.pool.load == [0] * n
    assert [r.read_ids for r in ours] == [r.read_ids for r in expected]
    for a, b in zip(ours, expected):
        for name in ("aln_off", "aln_kmer", "aln_event", "status", "ev_mean", "shift", "scale"):
            assert np.array_equal(getattr(a.batch, name), getattr(b.batch, name))
        assert a.products["calls"].llr.tobytes() == b.products["calls"].llr.tobytes()
        # with GPUs, the events and scalings ran ahead on the driver's front thread, and are timed as stages, and
        # so did the caller's finding of its sites
        assert set(a.batch.ran) == {"events", "scaling", "hmm ahead"} and not b.batch.ran
        assert set(a.timings) == set(b.timings) | {"hmm ahead"}


def test_a_batch_makes_only_its_events_means_where_no_sink_renders_the_rest(plans):
    """`streamer call` makes only the events' means (`keep_events=False`: no starts, lengths or spreads) and
    lets the signal go once they are made ahead: the scalings and the stages after them give the same
    alignments and calls as with every field made and kept."""
    options = PipelineOptions(threads=1, cuda=CudaOptions(disable=True))
    runs = {}
    for keep in (True, False):
        pipeline = Pipeline(options, [CpgCaller()])
        pipeline.pool = DevicePool([GpuDevice(0, FakeAbea(0, threading.Barrier(1), []))])  # so events run ahead
        got: list = []
        with Reference(REFERENCE) as ref, ThreadPoolExecutor(2) as pool:
            planned.run_batches(pipeline, iter(plans), ref, pool, RunSummary(), lambda done: got.extend(done.results),
                                Stages(pipeline, keep_signal=keep, keep_events=keep))  # fmt: skip
        runs[keep] = got
    for kept, lean in zip(runs[True], runs[False]):
        assert set(lean.batch.ran) == {"events", "scaling", "hmm ahead"}
        for name in ("ev_start", "ev_length", "ev_stdv", "signal"):
            assert getattr(lean.batch, name).size == 0 < getattr(kept.batch, name).size
        for name in ("ev_mean", "aln_off", "aln_kmer", "aln_event", "status", "shift", "scale", "var"):
            assert np.array_equal(getattr(lean.batch, name), getattr(kept.batch, name))
        assert lean.products["calls"].llr.tobytes() == kept.products["calls"].llr.tobytes()
    assert sum(len(r.products["calls"].llr) for r in runs[False]) > 0


class FakeLanes:
    """A GPU package whose devices hold `room` lanes each (a lane's ABEA is a plain object)."""

    def __init__(self, gpus: int, room: dict[int, int], refuse_second_on: int | None = None):
        self.gpus, self.room, self.refuse = gpus, room, refuse_second_on

    def count_gpus(self) -> int:
        return self.gpus

    def open_gpu(self, options):
        return FakeLane(options.dev_id, self.room[options.dev_id])

    def open_lane(self, abea):
        return None if abea.dev_id == self.refuse else FakeLane(abea.dev_id, abea.lanes)

    def device_context(self, dev_id):
        return contextlib.nullcontext


class FakeLane:
    def __init__(self, dev_id: int, lanes: int):
        self.dev_id, self.lanes = dev_id, lanes


def test_lanes_open_first_of_every_gpu_then_the_second_where_memory_holds_them(monkeypatch):
    from streamer.pipeline import stages

    monkeypatch.setattr(stages, "gpu_package", lambda: FakeLanes(2, {0: 2, 1: 1}))
    devices = stages.open_devices(CudaOptions(lanes=2).with_devices("all"))
    assert [d.dev_id for d in devices] == [0, 1, 0]  # GPU 1 holds one lane of the planned size
    assert len({id(d.abea) for d in devices}) == 3 and len({id(d.lock) for d in devices}) == 3
    monkeypatch.setattr(stages, "gpu_package", lambda: FakeLanes(2, {0: 2, 1: 2}, refuse_second_on=0))
    assert [d.dev_id for d in stages.open_devices(CudaOptions(lanes=2).with_devices("all"))] == [0, 1, 1]
    assert [d.dev_id for d in stages.open_devices(CudaOptions(lanes=1).with_devices("all"))] == [0, 1]
