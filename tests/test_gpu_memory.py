"""GPU memory that coexists: the ABEA arena is what the configured batches need, within mem_frac of
the free memory beside the HMM's, and a GPU with too little left is refused (the process runs on the CPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("numba.cuda")

from streamer.pipeline.gpu import CudaOptions  # noqa: E402
from streamer_gpu.host import arena_capacity, bytes_per_base  # noqa: E402
from streamer_gpu.memory import (  # noqa: E402
    EVENT_BYTES,
    HMM_LOCAL_BYTES_PER_THREAD,
    CONTEXT_BYTES,
    MODULE_BYTES,
    arena_bytes_for,
    device_bytes_for,
    fixed_bytes,
    hmm_bytes_for,
    plan_memory,
)

GB = 10**9
H100_THREADS = 132 * 2048


def test_the_arena_holds_one_whole_batch_and_no_more():
    opts = CudaOptions(max_reads=512, max_bases=5_000_000)
    plan = plan_memory(80 * GB, False, opts, 100, H100_THREADS)
    assert not plan.refused and plan.arena_bytes == arena_bytes_for(512, 5_000_000, 2.0, 100)
    cap = arena_capacity(plan.arena_bytes, 2.0, 100)
    assert cap.bases >= 5_000_000 - 1 and cap.reads >= 512
    assert plan.arena_bytes < 2 * GB  # not 0.9 of the 80 GB: other processes fit beside it


def test_many_processes_fit_where_the_first_took_all_before():
    """The issue's H200 (141 GB free): a second process used to find 14 GB and run out at the HMM launch."""
    opts = CudaOptions(max_reads=4096, max_bases=20_000_000)
    free = 141 * GB
    for _ in range(8):  # one per flow cell of a GridION and then some
        plan = plan_memory(free, False, opts, 100, H100_THREADS)
        assert not plan.refused
        free -= plan.arena_bytes + plan.other_bytes
    assert free > 0


def test_the_cap_is_mem_frac_of_the_free_memory_less_the_hmm():
    opts = CudaOptions(max_bases=5_000_000, mem_frac=0.5)
    want = arena_bytes_for(512, 5_000_000, 2.0, 100)
    free = int(1.5 * want)
    plan = plan_memory(free, False, opts, 100, 1000, fixed=0)
    hmm = hmm_bytes_for(5_000_000, 2.0, 1000)
    assert plan.other_bytes == hmm and plan.arena_bytes == int(free * 0.5) - hmm < want
    # the HMM's local memory is counted for every thread the device holds
    assert hmm_bytes_for(0, 2.0, H100_THREADS) == HMM_LOCAL_BYTES_PER_THREAD * H100_THREADS > GB


def test_too_little_free_memory_is_refused_with_the_numbers():
    plan = plan_memory(2 * GB, False, CudaOptions(max_bases=20_000_000), 100, H100_THREADS)
    assert plan.arena_bytes == 0 and "2.00 GB free" in plan.refused and "arena" in plan.refused


def test_no_hmm_no_hmm_memory_and_event_buffers_only_for_gpu_events():
    opts = CudaOptions(hmm=False)
    assert plan_memory(80 * GB, False, opts, 100, H100_THREADS).other_bytes == fixed_bytes(opts) == MODULE_BYTES
    assert fixed_bytes(CudaOptions(events=True)) == MODULE_BYTES + 2 * EVENT_BYTES


def test_autotune_leaves_the_tuner_one_step_of_room():
    fixed = plan_memory(80 * GB, False, CudaOptions(max_bases=5_000_000), 100)
    tuned = plan_memory(80 * GB, False, CudaOptions(max_bases=5_000_000, autotune=True), 100)
    assert tuned.arena_bytes == arena_bytes_for(1024, 10_000_000, 2.5, 100)
    assert tuned.arena_bytes > 2 * fixed.arena_bytes
    assert bytes_per_base(2.5, 100) > bytes_per_base(2.0, 100)


def test_integrated_gpus_default_to_a_smaller_share():
    opts = CudaOptions(max_bases=50_000_000)
    assert plan_memory(8 * GB, True, opts, 100).arena_bytes < plan_memory(8 * GB, False, opts, 100).arena_bytes


def test_the_reserve_is_never_taken_and_the_cap_bounds_arena_and_the_rest():
    """A basecaller's share held back: mem_frac applies to the free memory less the reserve, and the
    process's cap bounds its arena together with the HMM and the modules."""
    opts = CudaOptions(max_bases=20_000_000, mem_frac=0.5)  # a 7.2 GB arena: more than any cap below
    free = 10 * GB
    plain = plan_memory(free, True, opts, 100, 1000)
    reserved = plan_memory(free, True, replace(opts, reserve=4 * GB), 100, 1000)
    assert plain.arena_bytes + plain.other_bytes == free // 2
    assert reserved.arena_bytes + reserved.other_bytes == (free - 4 * GB) // 2
    capped = plan_memory(free, True, replace(opts, memory_cap=4 * GB), 100, 1000)
    # under a cap the process's context counts too (without one, it is already out of the free memory)
    assert capped.arena_bytes + capped.other_bytes + CONTEXT_BYTES == 4 * GB
    # a batch that fits whole under the cap takes what it needs, not the cap
    small = replace(opts, max_bases=1_000_000, memory_cap=2 * GB)
    assert plan_memory(free, True, small, 100, 1000).arena_bytes == arena_bytes_for(512, 1_000_000, 2.0, 100)
    refused = plan_memory(free, True, replace(opts, reserve=9 * GB, memory_cap=GB), 100, 1000)
    assert refused.arena_bytes == 0 and "reserved" in refused.refused and "cap" in refused.refused


def test_device_bytes_are_what_the_plan_takes_when_memory_allows():
    opts = CudaOptions(max_bases=2_000_000, autotune=True)
    plan = plan_memory(80 * GB, False, opts, 100, H100_THREADS)
    assert device_bytes_for(opts, 100, H100_THREADS) == plan.arena_bytes + plan.other_bytes + CONTEXT_BYTES
    assert device_bytes_for(replace(opts, max_bases=4_000_000), 100, H100_THREADS) > device_bytes_for(opts, 100,
                                                                                                      H100_THREADS)


class _Device:
    """A device as either numba binding shows it: its attributes by the binding's names."""

    MULTIPROCESSOR_COUNT = 132

    def __init__(self, **attrs):
        self.__dict__.update(attrs)


@pytest.mark.parametrize("name", ["MAX_THREADS_PER_MULTIPROCESSOR", "MAX_THREADS_PER_MULTI_PROCESSOR"])
def test_resident_threads_under_either_bindings_name(name):
    """numba-cuda (cuda-python) and numba's ctypes binding spell the per-SM limit differently; a name
    missed made the plan leave out the HMM's local memory (1.45 GB on an H200) under a cap."""
    from streamer_gpu.device import resident_threads

    assert resident_threads(_Device(**{name: 2048})) == H100_THREADS
    assert resident_threads(_Device()) == 0


def test_lanes_divide_the_share_and_fewer_open_where_a_lane_would_not_hold_a_batch():
    """Each lane (a compute thread's batch on the GPU at once) gets its own arena within the same share."""
    opts = CudaOptions(max_bases=5_000_000, lanes=2)
    one = plan_memory(80 * GB, False, replace(opts, lanes=1), 100, H100_THREADS)
    two = plan_memory(80 * GB, False, opts, 100, H100_THREADS)
    assert two.lanes == 2 and two.arena_bytes == one.arena_bytes  # plenty: each lane holds a whole batch
    assert device_bytes_for(opts, 100, H100_THREADS) == 2 * (one.arena_bytes + one.other_bytes) + CONTEXT_BYTES
    # a cap that holds one whole batch but not two: one lane with all of it, not two spilling to the CPU
    cap = one.arena_bytes + one.other_bytes + CONTEXT_BYTES + GB // 10
    capped = plan_memory(80 * GB, False, replace(opts, memory_cap=cap), 100, H100_THREADS)
    assert capped.lanes == 1 and capped.arena_bytes == one.arena_bytes
    assert plan_memory(80 * GB, False, replace(opts, memory_cap=3 * cap), 100, H100_THREADS).lanes == 2


@pytest.mark.parametrize("message", ["Grid size 3 will likely result in GPU under-utilization due to low occupancy.",
                                     "\x1b[1mGrid size 3 will likely result in GPU under-utilization due to low occupancy.\x1b[0m"])
def test_small_grids_are_not_warned_about(message):
    """A small batch's grid is normal: the filter the GPU stages install drops numba's warning about it,
    highlighted for a terminal or not, and no other."""
    import warnings

    from numba.core.errors import NumbaPerformanceWarning

    from streamer_gpu.abea import SMALL_GRID

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=SMALL_GRID)
        warnings.warn(NumbaPerformanceWarning(message))
        warnings.warn(NumbaPerformanceWarning("another performance note"))
    assert [str(w.message) for w in seen] == ["another performance note"]
