"""The memory budget: sizes parsed, and what a budget allows derived from it (pure decisions)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from streamer.config import build, ConfigError
from streamer.tuning.profiles import (PROFILES, SMALL_BUDGET, BATCH_BYTES_PER_BASE, CACHED_BYTES_PER_BASE, PROCESS_BYTES, DeviceShare,
                                      EVENT_BYTES_PER_BASE, GPU_PROCESS_BYTES, FORK_SERVER_BYTES, READER_PROCESS_BYTES,
                                      Machine, batch_bytes_per_base, budget_bytes, memory_plan, parse_size, plan)


def test_sizes():
    assert parse_size("300M") == 300 << 20
    assert parse_size("2G") == parse_size("2GiB") == 2 << 30
    assert parse_size("1.5g") == 3 << 29
    assert parse_size("4096") == 4096
    for bad in ("", "lots", "2X", "-1G"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_budget_from_profile_or_given():
    cpu = PROFILES["cpu"]
    assert budget_bytes("auto", cpu, 2) == 300 << 20
    assert budget_bytes("auto", cpu, 8) == (300 << 20) + 4 * (64 << 20)
    assert budget_bytes("1G", cpu, 2) == 1 << 30


def test_small_budget_reads_in_threads_one_batch_at_a_time():
    m = memory_plan(300 << 20, 5_000_000, compute_threads=2, io_workers=2)
    assert (m.io_mode, m.ahead, m.compute_threads) == ("threads", 1, 1)
    in_flight = m.ahead + 1 + 2 * m.compute_threads
    assert PROCESS_BYTES + in_flight * m.max_bases * BATCH_BYTES_PER_BASE <= 300 << 20


def test_batches_grow_where_abea_is_on_a_discrete_gpu_and_their_events_go_after_the_scalings():
    """The GPU box's 3G plan (16 reader processes and the parser): its batches hold fewer bytes a base than
    the CPU's, and fewer still without their events, so B grows; the host's whole plan stays within it."""
    args = (3 << 30, 50_000_000, 2, 17)
    cpu, gpu_kept, gpu = (memory_plan(*args, discrete_gpu=g, events=e) for g, e in ((False, True), (True, True),
                                                                                     (True, False)))
    assert cpu.max_bases < gpu_kept.max_bases < gpu.max_bases
    assert batch_bytes_per_base(True, False) == batch_bytes_per_base(True, True) - EVENT_BYTES_PER_BASE
    assert batch_bytes_per_base(False, True) == BATCH_BYTES_PER_BASE
    in_flight = gpu.ahead + 1 + 2 * gpu.compute_threads
    host = (PROCESS_BYTES + GPU_PROCESS_BYTES + FORK_SERVER_BYTES + 17 * READER_PROCESS_BYTES
            + in_flight * gpu.max_bases * batch_bytes_per_base(True, False))
    assert host <= 3 << 30 < host + in_flight * 20_000 * batch_bytes_per_base(True, False)
    assert memory_plan(*args, events=False).max_bases > cpu.max_bases  # the CPU's batches let them go too
    # a laptop's 1G leaves the GPU's process too little: its batches are planned on the host's account, not
    # left at the floor
    laptop = (1 << 30, 5_000_000, 2, 3)
    assert memory_plan(*laptop, discrete_gpu=True, events=False) == memory_plan(*laptop, events=False)


def test_batch_cap_does_not_grow_past_the_given_one_and_has_a_floor():
    big = memory_plan(64 << 30, 5_000_000, compute_threads=2, io_workers=16)
    assert big.max_bases == 5_000_000 and big.io_mode == "auto" and big.ahead == 2
    tiny = memory_plan(1 << 20, 5_000_000, compute_threads=2, io_workers=2)
    assert tiny.max_bases > 0
    assert memory_plan(SMALL_BUDGET, 5_000_000, 2, 2, "processes").io_mode == "processes"


def test_the_tuner_grows_batches_no_further_than_the_budget_holds():
    """Whatever B a run starts from, the largest the budget holds bounds B in the plan the tuner keeps to."""
    from streamer.pipeline.gpu import GpuInfo
    from streamer.tuning.controller import Controller

    gpu_box = plan(Machine(GpuInfo("H100", 80 << 30, 79 << 30, False, 132 * 2048), 16, 128 << 30), "hpc")
    memory = memory_plan(2 << 30, 1_000_000, compute_threads=2, io_workers=2)
    assert memory.max_bases == 1_000_000 < memory.most_bases < gpu_box.bounds.max_bases[1]
    budgeted = gpu_box.budgeted(memory)
    assert budgeted.bounds.max_bases == (gpu_box.bounds.max_bases[0], memory.most_bases)
    # a controller on the budgeted plan may double B only up to that bound
    c = Controller(budgeted.settings, budgeted.bounds)
    assert c.bounds.of("max_bases", c.settings)[1] == memory.most_bases
    # and starts from the budget's B, not the profile's: a tuner's first move keeps it (the daemon applies the
    # tuner's whole settings, so a move of another knob would otherwise take B back past the budget)
    assert budgeted.settings.max_bases == memory.max_bases < gpu_box.settings.max_bases
    assert memory_plan(64 << 30, 5_000_000, 2, 16).most_bases > 5_000_000  # never below what was asked


def test_config_key_is_checked():
    with pytest.raises(ConfigError, match="pipeline.memory_budget"):
        build({"pipeline.memory_budget": "lots"}, require=())
    assert build({"pipeline.memory_budget": "2G"}, require=()).pipeline.memory_budget == "2G"
    for key in ("gpu.reserve", "gpu.memory"):
        with pytest.raises(ConfigError, match=key):
            build({key: "lots"}, require=())
    gpu = build({"gpu.reserve": "2G", "gpu.memory": "3G", "gpu.stream_priority": "low"}, require=()).gpu
    assert (gpu.reserve, gpu.memory, gpu.stream_priority) == ("2G", "3G", "low")


def test_the_daemon_sizes_its_batches_and_readers_from_its_budget(tmp_path):
    from streamer import config
    from streamer.commands.run import budgeted

    cpu = plan(Machine(None, 2, 8 << 30), "cpu")
    base = config.Config()
    small, small_plan = budgeted(config.Config(pipeline=config.PipelineConfig(threads=2, memory_budget="300M")), cpu)
    assert small.batch.max_bases < base.batch.max_bases and small.pipeline.io_mode == "threads"
    held = small.join.max_pending_bases * CACHED_BYTES_PER_BASE  # its basecall cache, within a tenth of the budget
    assert small.batch.max_bases == memory_plan(300 << 20, base.batch.max_bases, 1, 2, held=held).max_bases
    assert 0 < held <= 30 << 20
    assert small_plan.limits()["memory_budget"] == 300 << 20 and small.gpu.memory is None
    roomy, _ = budgeted(config.Config(pipeline=config.PipelineConfig(threads=2, memory_budget="64G")), cpu)
    assert roomy.batch == base.batch and roomy.pipeline.io_mode == base.pipeline.io_mode


def _linear(fixed: int, per_base: int) -> DeviceShare:
    return DeviceShare(lambda b: fixed + per_base * b)


def test_one_budget_for_host_and_gpu_where_they_are_one_memory():
    """On a unified board B is the largest whose host batches and GPU part fit the budget together; what
    the host part leaves is the GPU's share, within its cap."""
    budget, fixed, per_base = 6 << 30, 400 << 20, 1000
    m = memory_plan(budget, 50_000_000, 1, 2, "threads", _linear(fixed, per_base))
    host = PROCESS_BYTES + (m.ahead + 1 + 2 * m.compute_threads) * m.max_bases * BATCH_BYTES_PER_BASE
    assert host + fixed + per_base * m.max_bases <= budget
    assert host + fixed + per_base * (m.max_bases + 1) > budget  # the largest that fits
    assert m.gpu_bytes == budget - host and m.gpu_bytes >= fixed + per_base * m.max_bases
    alone = memory_plan(budget, 50_000_000, 1, 2, "threads")
    assert alone.gpu_bytes is None and alone.max_bases > m.max_bases  # the host alone gets more
    capped = memory_plan(budget, 50_000_000, 1, 2, "threads", DeviceShare(lambda b: fixed + per_base * b, 1 << 30))
    assert capped.gpu_bytes == 1 << 30 and fixed + per_base * capped.max_bases <= 1 << 30 < m.gpu_bytes
    # a batch cap that fits leaves the GPU part all the rest; a budget too small still plans the smallest batches
    assert memory_plan(budget, 1_000_000, 1, 2, "threads", _linear(fixed, per_base)).max_bases == 1_000_000
    assert memory_plan(200 << 20, 5_000_000, 1, 2, "threads", _linear(fixed, per_base)).max_bases > 0


def test_a_jetson_daemon_gives_its_gpu_the_share_of_the_budget_the_host_leaves():
    """The daemon on an Orin NX (faked board): the plan's GPU part (arena, HMM, modules, from the GPU
    package's own arithmetic) and its host batches fit the one budget; the share is the arena's cap,
    in the configuration the pipeline is built from and in the limits summary.json records."""
    pytest.importorskip("numba.cuda")
    from streamer import config
    from streamer.commands.run import budgeted, cuda_options
    from streamer.pipeline.gpu import GpuInfo, gpu_package
    from streamer.tuning.board import Board

    board = Board("NVIDIA Jetson Orin NX Engineering Reference Developer Kit", "R36.3.0")
    orin = Machine(GpuInfo("Orin", 15 << 30, 12 << 30, True, 8 * 1536), 8, 15 << 30, board)
    given = {"memory_budget": "3G", "threads": 6}
    base = config.Config().with_tunables(plan(orin, given=given).limits())  # as `plan_config` resolves it
    cfg, p = budgeted(base, plan(orin, given=given))
    gpu = p.gpu.memory
    options = cuda_options(cfg)
    assert options.memory_cap == gpu == p.limits()["gpu_memory"] and options.stream_priority == "low"
    assert options.reserve == 4 << 30 and p.limits()["unified_memory"] and p.limits()["memory_budget"] == 3 << 30
    device = gpu_package().device_bytes(options, 100, 8 * 1536)  # what the arena plan will want for this B
    host = PROCESS_BYTES + 5 * cfg.batch.max_bases * BATCH_BYTES_PER_BASE + 75 * 2**20 + 6 * 40 * 2**20
    cache = cfg.join.max_pending_bases * CACHED_BYTES_PER_BASE  # basecalls waiting for their signal
    assert device <= gpu and host + cache + gpu <= 3 << 30 and cfg.batch.max_bases < 5_000_000
    assert 0 < cache <= 0.1 * (3 << 30)
    # the same board without its GPU (ABEA on the CPU): the whole budget is the host's
    cpu_cfg, cpu_plan = budgeted(base, plan(Machine(None, 8, 15 << 30, board), given=given))
    assert cpu_plan.gpu.memory is None and cpu_cfg.gpu.memory is None and cpu_cfg.batch.max_bases > cfg.batch.max_bases


def test_the_daemons_basecall_cache_counts_in_its_budget():
    """The daemon's basecalls waiting for their signal are bounded within a tenth of its budget, and its
    batches are sized from what the cache leaves: a smaller cap leaves larger batches."""
    from streamer import config
    from streamer.commands.run import budgeted

    machine = Machine(None, 16, 64 << 30)
    given = {"memory_budget": "3G", "threads": 16}
    base = config.Config().with_tunables(plan(machine, given=given).limits())
    cfg, _ = budgeted(base, plan(machine, given=given))
    assert cfg.join.max_pending_bases * CACHED_BYTES_PER_BASE <= 0.1 * (3 << 30) < 200_000_000 * CACHED_BYTES_PER_BASE
    small = replace(base, join=replace(base.join, max_pending_bases=1_000_000))
    small_cfg, _ = budgeted(small, plan(machine, given=given))
    assert small_cfg.join.max_pending_bases == 1_000_000 and small_cfg.batch.max_bases > cfg.batch.max_bases
