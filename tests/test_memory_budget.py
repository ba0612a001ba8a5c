"""The memory budget: sizes parsed, and what a budget allows derived from it (pure decisions)."""

from __future__ import annotations

import pytest

from streamer.config import build, ConfigError
from streamer.tuning.profiles import (PROFILES, SMALL_BUDGET, BATCH_BYTES_PER_BASE, PROCESS_BYTES, budget_bytes,
                                      memory_plan, parse_size)


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


def test_batch_cap_does_not_grow_past_the_given_one_and_has_a_floor():
    big = memory_plan(64 << 30, 5_000_000, compute_threads=2, io_workers=16)
    assert big.max_bases == 5_000_000 and big.io_mode == "auto" and big.ahead == 2
    tiny = memory_plan(1 << 20, 5_000_000, compute_threads=2, io_workers=2)
    assert tiny.max_bases > 0
    assert memory_plan(SMALL_BUDGET, 5_000_000, 2, 2, "processes").io_mode == "processes"


def test_config_key_is_checked():
    with pytest.raises(ConfigError, match="pipeline.memory_budget"):
        build({"pipeline.memory_budget": "lots"}, require=())
    assert build({"pipeline.memory_budget": "2G"}, require=()).pipeline.memory_budget == "2G"


def test_the_daemon_sizes_its_batches_and_readers_from_its_budget(tmp_path):
    from streamer import config
    from streamer.commands.run import budgeted

    cpu = PROFILES["cpu"]
    base = config.Config()
    small = budgeted(config.Config(pipeline=config.PipelineConfig(threads=2, memory_budget="300M")), cpu)
    assert small.batch.max_bases < base.batch.max_bases and small.pipeline.io_mode == "threads"
    assert small.batch.max_bases == memory_plan(300 << 20, base.batch.max_bases, 1, 2).max_bases
    roomy = budgeted(config.Config(pipeline=config.PipelineConfig(threads=2, memory_budget="64G")), cpu)
    assert roomy.batch == base.batch and roomy.pipeline.io_mode == base.pipeline.io_mode
