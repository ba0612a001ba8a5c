"""The tuning monitor and the tuner: each leaf of f5c's two trees and each guard from crafted
measurements; advice after more than 3 repeats; the controller's moves, bounds, hysteresis and
reverts; learned values on disk; device profiles; and replays of pathological starts through
the real GPU split under a synthetic cost model (tests/tuning_replay.py)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from streamer_gpu.host import arena_capacity
from streamer.pipeline.gpu import AbeaBatchStats, CudaOptions, GpuInfo
from streamer.tuning import (
    PROFILES,
    Bounds,
    Controller,
    Guard,
    LoadLeaf,
    Machine,
    Measurements,
    MemoryLeaf,
    Monitor,
    Policy,
    Settings,
    TuningStore,
    pick_profile,
    plan,
    user_set,
)
from streamer.tuning.monitor import guards, load_leaf, memory_leaf
from streamer.tuning.profiles import with_settings
from streamer.tuning.session import AutoTuner, TunedLimits

from tuning_replay import Reads, Replay, fixed, replay, throughput

GIB = 1 << 30


def meas(**kw) -> Measurements:
    """A healthy batch of 500 reads (K 512, B 5 Mb): arrays 80% full, CPU and GPU 1 s each."""
    base = dict(n_reads=500, n_bases=3_000_000, max_reads=512, max_bases=5_000_000, n_gpu=480, n_cpu=20, n_ultra=0,
                n_memout=0, n_long=0, n_events=0, x_util=0.8, y_util=0.8, t_cpu=1.0, t_gpu=1.0, t_pack=0.0,
                t_h2d=0.0, t_kernels=0.0, t_d2h=0.0, t_ultra=0.0, cells=0)
    return Measurements(**{**base, **kw})


def stats(**kw) -> AbeaBatchStats:
    """The same healthy batch as the GPU stage reports it."""
    m = meas()
    base = dict(n_reads=m.n_reads, n_bases=m.n_bases, max_reads=m.max_reads, max_bases=m.max_bases, n_gpu=m.n_gpu,
                n_cpu=m.n_cpu, n_ultra=0, n_memout=0, n_long=0, n_events=0, x_util=0.8, y_util=0.8, t_cpu=1.0,
                t_gpu=1.0, t_pack=0.0, t_h2d=0.0, t_kernels=0.0, t_d2h=0.0, t_ultra=0.0, cells=0)
    return AbeaBatchStats(**{**base, **kw})


# ---------------------------------------------------------------- Fig. 9a, one test per leaf


def test_memory_fine_both_arrays_over_70():
    assert memory_leaf(meas(x_util=0.75, y_util=0.71)) is MemoryLeaf.FINE


def test_memory_s1_event_arrays_under_used():
    assert memory_leaf(meas(x_util=0.95, y_util=0.60)) is MemoryLeaf.S1


def test_memory_s2_read_arrays_under_used():
    assert memory_leaf(meas(x_util=0.30, y_util=0.99)) is MemoryLeaf.S2


def test_memory_gap_of_30_or_less_is_no_advice():
    assert memory_leaf(meas(x_util=0.85, y_util=0.60)) is MemoryLeaf.UNEVEN
    assert memory_leaf(meas(x_util=0.50, y_util=0.75)) is MemoryLeaf.UNEVEN


def test_memory_s3_bases_cap_reached_first():
    assert memory_leaf(meas(x_util=0.3, y_util=0.3, n_reads=200, n_bases=5_000_000)) is MemoryLeaf.S3


def test_memory_s4_reads_cap_reached_first():
    assert memory_leaf(meas(x_util=0.3, y_util=0.3, n_reads=512, n_bases=1_000_000)) is MemoryLeaf.S4


def test_memory_neither_cap_reached_is_the_last_batch():
    assert memory_leaf(meas(x_util=0.3, y_util=0.3, n_reads=100, n_bases=600_000)) is MemoryLeaf.LAST


def test_memory_both_caps_reached_is_no_advice():
    assert memory_leaf(meas(x_util=0.3, y_util=0.3, n_reads=512, n_bases=5_000_000)) is MemoryLeaf.BOTH_CAPS


# ---------------------------------------------------------------- Fig. 9b, one test per leaf

CPU_SLOW = dict(t_cpu=2.0, t_gpu=1.0)  # f = 1/3


def test_load_t1_reads_out_of_arena_memory():
    assert load_leaf(meas(**CPU_SLOW, n_memout=51, n_long=60)) is LoadLeaf.T1  # checked first, as in f5c


def test_load_t2_very_long_reads():
    assert load_leaf(meas(**CPU_SLOW, n_long=51, n_events=60)) is LoadLeaf.T2


def test_load_t3_over_segmented_reads():
    assert load_leaf(meas(**CPU_SLOW, n_events=51)) is LoadLeaf.T3


def test_load_t4_cpu_slow_for_no_counted_reason():
    assert load_leaf(meas(**CPU_SLOW, n_memout=50, n_long=50, n_events=50)) is LoadLeaf.T4  # 10% is not > 10%


def test_load_t5_gpu_slow():
    assert load_leaf(meas(t_cpu=1.0, t_gpu=2.0)) is LoadLeaf.T5


def test_load_balanced_within_30_percent():
    assert load_leaf(meas(t_cpu=1.8, t_gpu=1.0)) is LoadLeaf.BALANCED  # f = 0.29
    assert load_leaf(meas(t_cpu=1.0, t_gpu=1.8)) is LoadLeaf.BALANCED
    assert meas(t_cpu=1.8, t_gpu=1.0).factor == pytest.approx(0.8 / 2.8)


# ---------------------------------------------------------------- guards


def _decide(m: Measurements, extra=()):
    return Monitor().observe(m, extra)


def test_guard_last_batch_keeps_both_trees_out():
    d = _decide(meas(last=True, x_util=0.3, y_util=0.3, n_reads=512, n_bases=1_000_000, t_cpu=0.1))
    assert d.guards == (Guard.LAST_BATCH,) and d.memory is None and d.load is None


def test_guard_single_read_keeps_both_trees_out():
    # one read longer than B: n < K, b >= B reads as S3, and f = -1 as T5
    d = _decide(meas(n_reads=1, n_bases=6_000_000, x_util=0.3, y_util=0.3, t_cpu=0.0, t_gpu=1.0))
    assert Guard.SINGLE_READ in d.guards and d.memory is None and d.load is None


def test_guard_single_read_with_k_of_one_still_reaches_s4():
    d = _decide(meas(n_reads=1, max_reads=1, n_bases=5000, x_util=0.001, y_util=0.001, t_cpu=0.0, t_gpu=0.2))
    assert d.memory is MemoryLeaf.S4 and d.load is None and d.guards == (Guard.TINY,)


def test_guard_gpu_fallback_keeps_both_trees_out():
    d = _decide(meas(fallback="CUDA error", t_cpu=3.0))
    assert d.guards == (Guard.GPU_FALLBACK,) and d.memory is None and d.load is None


def test_guard_tiny_batch_keeps_the_load_tree_out():
    few = _decide(meas(n_reads=12, t_cpu=0.0, t_gpu=0.5))  # f = -1 from a dozen reads
    assert few.guards == (Guard.TINY,) and few.load is None and few.memory is MemoryLeaf.FINE
    quick = _decide(meas(t_cpu=0.001, t_gpu=0.02))  # launch and copy costs, not work
    assert quick.guards == (Guard.TINY,) and quick.load is None


def test_guard_settling_batch_keeps_both_trees_out():
    d = _decide(meas(t_cpu=3.0), (Guard.SETTLING,))
    assert d.guards == (Guard.SETTLING,) and d.memory is None and d.load is None


def test_guards_in_one_place():
    assert guards(meas()) == ()
    assert guards(meas(last=True, fallback="CUDA error", n_reads=1)) == (Guard.LAST_BATCH, Guard.SINGLE_READ,
                                                                  Guard.GPU_FALLBACK, Guard.TINY)


# ---------------------------------------------------------------- advice after more than 3 repeats

T5_BATCH = dict(t_cpu=0.5, t_gpu=1.0)


def test_advice_on_the_fifth_batch_in_a_row_as_f5c():
    mon = Monitor()
    advice = [mon.observe(meas(**T5_BATCH)).advice for _ in range(6)]
    assert advice[:4] == [()] * 4 and advice[4] == advice[5] == (LoadLeaf.T5,)


def test_another_leaf_starts_the_count_again():
    mon = Monitor()
    for _ in range(4):
        mon.observe(meas(**T5_BATCH))
    d = mon.observe(meas())
    assert d.load is LoadLeaf.BALANCED and d.load_run == 1
    assert [mon.observe(meas(**T5_BATCH)).advice for _ in range(5)][-1] == (LoadLeaf.T5,)


def test_a_guarded_batch_neither_counts_nor_breaks_a_run():
    mon = Monitor()
    for _ in range(3):
        mon.observe(meas(**T5_BATCH))
    d = mon.observe(meas(**T5_BATCH, last=True))
    assert d.load is None and d.load_run == 3
    assert mon.observe(meas(**T5_BATCH)).advice == ()
    assert mon.observe(meas(**T5_BATCH)).advice == (LoadLeaf.T5,)


def test_memory_and_load_advice_together_memory_first():
    mon = Monitor()
    batch = meas(x_util=0.3, y_util=0.3, n_reads=512, n_bases=1_000_000, **T5_BATCH)
    d = [mon.observe(batch) for _ in range(5)][-1]
    assert d.advice == (MemoryLeaf.S4, LoadLeaf.T5)
    assert d.as_dict()["advice"] == ["S4", "T5"] and json.dumps(d.as_dict())


# ---------------------------------------------------------------- the controller's moves


def feed(c: Controller, batches: int, **kw) -> list:
    """batches of the same measurements; the actions in order."""
    out = []
    for _ in range(batches):
        out += c.observe(stats(**kw))
    return out


def test_advice_only_without_autotune():
    c = Controller(Settings(), policy=Policy(autotune=False))
    assert feed(c, 8, t_cpu=0.5, t_gpu=1.0) == []
    assert c.decision.advice == (LoadLeaf.T5,) and c.settings == Settings() and c.changes == []


def test_without_balance_the_load_tree_advises_and_the_memory_tree_acts():
    c = Controller(Settings(max_reads=64), policy=Policy(balance=False))
    (a,) = feed(c, 5, n_reads=64, max_reads=64, n_bases=400_000, x_util=0.05, y_util=0.05, **T5_BATCH)
    assert c.decision.advice == (MemoryLeaf.S4, LoadLeaf.T5) and (a.knob, a.leaf) == ("max_reads", "S4")
    assert feed(c, 12, n_reads=256, max_reads=256, n_bases=1_600_000, x_util=0.85, y_util=0.85, **T5_BATCH) == []
    assert c.decision.advice == (LoadLeaf.T5,) and c.settings.max_lf == Settings().max_lf and c.stuck == ()


def test_s4_raises_k_towards_a_full_arena_at_most_four_times():
    c = Controller(Settings(max_reads=64))
    (a,) = feed(c, 5, n_reads=64, max_reads=64, n_bases=400_000, x_util=0.05, y_util=0.05)
    assert (a.knob, a.old, a.new, a.leaf, a.batch) == ("max_reads", 64, 256, "S4", 5)
    c = Controller(Settings(max_reads=400))
    (a,) = feed(c, 5, n_reads=400, n_bases=2_000_000, x_util=0.5, y_util=0.45)
    assert a.new == round(400 * 0.85 / 0.5)


def test_s3_raises_b():
    c = Controller(Settings())
    (a,) = feed(c, 5, n_reads=300, n_bases=5_100_000, x_util=0.5, y_util=0.5)
    assert (a.knob, a.leaf, a.new) == ("max_bases", "S3", 8_500_000)


def test_s1_and_s2_partition_for_the_events_per_base_measured():
    c = Controller(Settings(avg_epk=2.0))
    (a,) = feed(c, 5, x_util=0.95, y_util=0.57)  # GPU reads had 2.0 * 0.57 / 0.95 = 1.2 events per base
    assert (a.knob, a.leaf, a.new) == ("avg_epk", "S1", round(1.2 * 1.05, 3))
    c = Controller(Settings(avg_epk=2.0))
    (a,) = feed(c, 5, x_util=0.6, y_util=0.99)
    assert (a.knob, a.leaf, a.new) == ("avg_epk", "S2", round(2.0 * 0.99 / 0.6 * 1.05, 3))


def test_t1_lowers_k_to_what_fitted():
    c = Controller(Settings(max_reads=4096, max_bases=50_000_000))
    (a,) = feed(c, 5, n_reads=4096, n_bases=20_000_000, n_memout=3000, x_util=1.0, y_util=0.95, t_cpu=3.0)
    assert (a.knob, a.leaf, a.new) == ("max_reads", "T1", 1096)


def test_t2_t3_raise_the_split_thresholds():
    c = Controller(Settings())
    (a,) = feed(c, 5, n_long=80, **CPU_SLOW)
    assert (a.knob, a.old, a.new, a.leaf) == ("max_lf", 3.0, 4.5, "T2")
    c = Controller(Settings())
    (a,) = feed(c, 5, n_events=80, **CPU_SLOW)
    assert (a.knob, a.old, a.new, a.leaf) == ("max_epk", 5.0, 6.25, "T3")


def test_t4_lowers_the_ultra_long_threshold():
    c = Controller(Settings())
    (a,) = feed(c, 5, **CPU_SLOW)
    assert (a.knob, a.new, a.leaf) == ("ultra_thresh", 50_000, "T4")


def test_t5_moves_ultra_long_reads_beside_the_gpu_first_else_long_reads_to_the_cpu():
    c = Controller(Settings())
    (a,) = feed(c, 5, n_ultra=3, **T5_BATCH)
    assert (a.knob, a.new, a.leaf) == ("ultra_thresh", 200_000, "T5")
    c = Controller(Settings())
    (a,) = feed(c, 5, **T5_BATCH)
    assert (a.knob, a.new) == ("max_lf", 2.0)


def test_moves_stay_within_bounds_and_say_when_nothing_is_left():
    c = Controller(Settings(max_lf=1.0, max_epk=1.5, avg_epk=1.5))
    assert feed(c, 6, **T5_BATCH) == []
    assert c.stuck == (LoadLeaf.T5,)
    c = Controller(Settings(max_reads=60_000))
    (a,) = feed(c, 5, n_reads=60_000, max_reads=60_000, n_bases=1_000_000, x_util=0.01, y_util=0.01)
    assert a.new == Bounds().max_reads[1]


def test_a_change_is_followed_by_a_settling_batch_and_fresh_evidence():
    c = Controller(Settings())
    assert len(feed(c, 5, **T5_BATCH)) == 1
    assert c.observe(stats(**T5_BATCH)) == [] and c.decision.guards == (Guard.SETTLING,)
    assert c.decision.load is None
    # five new batches of evidence, not the old run, before the next advice
    assert [len(c.observe(stats(**T5_BATCH))) for _ in range(4)] == [0, 0, 0, 1]  # effect measured: carried on


def test_every_change_is_recorded_with_its_measured_effect():
    c = Controller(Settings())
    feed(c, 5, **T5_BATCH)  # 3 Mb per second of the stage...
    feed(c, 5, t_cpu=0.5, t_gpu=0.6)  # ...then a settling batch and 5 Mb per second
    (change,) = c.changes
    assert change.before.batches == 4 and change.after.batches == 4
    assert change.effect == pytest.approx(1.0 / 0.6 - 1)
    assert c.measured == (change,)  # the batch that completed it
    assert c.summary()["changes"][0]["effect"] == pytest.approx(change.effect)


def test_a_change_that_costs_throughput_is_undone_and_its_direction_closed():
    c = Controller(Settings())
    feed(c, 5, n_long=80, **CPU_SLOW)  # T2: max_lf 3 -> 4.5
    (revert,) = feed(c, 5, n_long=80, t_cpu=3.0, t_gpu=1.0)  # a third slower
    assert (revert.knob, revert.old, revert.new, revert.leaf) == ("max_lf", 4.5, 3.0, "revert")
    assert "cost 33%" in revert.why and "max_lf up closed" in revert.why and c.settings.max_lf == 3.0
    (closure,) = c.closing
    assert (closure.knob, closure.way, closure.value) == ("max_lf", "up", 3.0)
    assert closure.effect == pytest.approx(-1 / 3) and closure.noise == pytest.approx(0.05)
    # the same advice again: no move up of max_lf, not even a smaller one; T2 has nothing else to move
    assert feed(c, 20, n_long=80, **CPU_SLOW) == []
    assert c.stuck == (LoadLeaf.T2,) and c.settings.max_lf == 3.0


def test_a_change_is_judged_by_the_batch_s_stages_where_the_pipeline_timed_them():
    """In a pipeline the reads T5 sends to the CPU take the cores of the other stages and batches: the split
    that speeds the ABEA stage (GPU 1 s, CPU 0.5 s -> 0.8 s each) but slows the batch's stages from 3 s to 4 s
    is undone, and max-lf down closed; with the stage alone timed (no t_batch) it would be kept."""
    c = Controller(Settings())
    (a,) = feed(c, 5, **T5_BATCH, t_batch=3.0)
    assert (a.knob, a.old, a.new) == ("max_lf", 3.0, 2.0)
    (revert,) = feed(c, 5, t_cpu=0.8, t_gpu=0.8, t_batch=4.0)
    assert revert.leaf == "revert" and c.settings.max_lf == 3.0 and ("max_lf", -1) in c.closed
    assert c.changes[0].effect == pytest.approx(3.0 / 4.0 - 1)
    alone = Controller(Settings())
    feed(alone, 5, **T5_BATCH)
    feed(alone, 5, t_cpu=0.8, t_gpu=0.8)
    assert alone.changes[0].effect == pytest.approx(1.0 / 0.8 - 1) and alone.settings.max_lf == 2.0


def test_a_closed_direction_holds_for_every_step_size_and_every_leaf():
    """The issue's walk back: max-lf down cost 79%; T5 then moves max-epk, never max-lf down again."""
    c = Controller(Settings())
    (a,) = feed(c, 5, **T5_BATCH)
    assert (a.knob, a.old, a.new) == ("max_lf", 3.0, 2.0)
    (revert,) = feed(c, 5, t_cpu=0.5, t_gpu=5.0)  # the GPU side left with far less to do, the CPU with far more
    assert revert.leaf == "revert" and c.settings.max_lf == 3.0
    later = feed(c, 60, **T5_BATCH)
    assert later and all(not (a.knob == "max_lf" and a.new < a.old) for a in later)
    assert ("max_lf", -1) in c.closed


def test_a_loss_within_the_noise_floor_is_kept():
    c = Controller(Settings())
    feed(c, 5, n_long=80, **CPU_SLOW)  # T2: max_lf 3 -> 4.5 at 1 Mb per s of stage time (3 Mb in 3 s)
    feed(c, 5, n_long=80, t_cpu=2.06, t_gpu=1.0)  # 3% slower: under the 5% floor
    (change, *_) = c.changes
    assert change.effect == pytest.approx(1 / 1.03 - 1, abs=1e-9)
    assert not c.closed and c.settings.max_lf >= 4.5 and all(ch.action.leaf != "revert" for ch in c.changes)


def test_the_noise_floor_grows_with_the_spread_of_the_batches():
    """Batches whose stage times vary by a fifth make an 11% loss indistinguishable from noise."""
    c = Controller(Settings())
    for t in (2.5, 2.8, 2.2, 2.8, 2.5):
        c.observe(stats(n_long=80, t_cpu=t, t_gpu=1.0))  # T2 on the fifth: max_lf 3 -> 4.5
    assert c.settings.max_lf == 4.5
    for t in (2.9, 2.6, 3.2, 2.6, 3.2):  # settling batch, then 4 batches 11% slower on the whole
        c.observe(stats(n_long=80, t_cpu=t, t_gpu=1.0))
    (change, *_) = c.changes
    assert change.effect < -0.10 and change.noise_floor(c.policy) > -change.effect
    assert not c.closed


def test_a_closed_direction_reopens_when_the_regime_moves():
    c = Controller(Settings())
    feed(c, 5, n_long=80, **CPU_SLOW)
    feed(c, 5, n_long=80, t_cpu=3.0, t_gpu=1.0)  # closes max_lf up under a CPU/GPU ratio of 2
    assert ("max_lf", 1) in c.closed
    assert feed(c, 10, n_long=80, t_cpu=3.0, t_gpu=1.9) == []  # ratio 1.6: the same regime
    assert ("max_lf", 1) in c.closed
    moves = []
    reopened = []
    for _ in range(10):  # the CPU side now five times the GPU's: another regime
        moves += c.observe(stats(n_long=80, t_cpu=5.0, t_gpu=1.0))
        reopened += c.reopened
    ((closure, why),) = reopened
    assert closure.knob == "max_lf" and why.startswith("CPU/GPU time ratio")
    assert moves and moves[0].knob == "max_lf" and moves[0].new > 3.0


def test_closed_directions_are_kept_across_starts(tmp_path):
    gpu = GpuInfo("Test GPU", 8 * GIB, 8 * GIB, False)
    store = TuningStore(tmp_path)
    c = Controller(Settings())
    feed(c, 5, n_long=80, **CPU_SLOW)
    feed(c, 5, n_long=80, t_cpu=3.0, t_gpu=1.0)
    store.save(gpu, c.settings, len(c.changes), c.closed.values())
    (loaded,) = store.load_closed(gpu)
    assert loaded == c.closed[("max_lf", 1)]
    again = Controller(Settings(), closed=store.load_closed(gpu))
    assert feed(again, 10, n_long=80, **CPU_SLOW) == [] and again.stuck == (LoadLeaf.T2,)


def test_no_oscillation_where_no_setting_balances():
    """A plant that flips from CPU-bound to GPU-bound at max_lf 2.0 with nothing in between:
    the controller brackets the step, narrows it, and stops."""
    c = Controller(Settings())
    history = []
    for _ in range(400):
        lf = c.settings.max_lf
        batch = dict(n_long=80, **CPU_SLOW) if lf < 2.0 else T5_BATCH
        c.observe(stats(**batch))
        history.append(lf)
    moves = [ch.action for ch in c.changes]
    assert 3 <= len(moves) <= 14  # each knob: a bracket narrowed down to min_step, then left alone
    assert len(set(history[-200:])) == 1  # settled long before the end
    lows = [a.old for a in moves if a.new > a.old]
    highs = [a.old for a in moves if a.new < a.old]
    assert max(lows) < min(highs)  # every move stays inside the bracket found so far


def test_load_corrections_are_carried_to_the_middle_of_the_band():
    """Entering at |f| > 0.3 and leaving only under 0.15: no resting near the tree's threshold."""
    c = Controller(Settings())
    for _ in range(60):
        # the GPU's time grows with max_lf: f = -0.41 at 3.0, -0.17 at 2.0, 0 at 1.6
        c.observe(stats(t_cpu=1.0, t_gpu=max(0.3, c.settings.max_lf - 0.6), n_long=80))
    assert abs(c.decision.measurements.factor) <= 0.15
    leaves = [(ch.action.leaf, ch.action.why.startswith("carried on")) for ch in c.changes]
    assert leaves[0] == ("T5", False) and len(leaves) >= 2 and all(carried for _, carried in leaves[1:])


def test_a_long_read_correction_goes_on_after_the_tree_stops_blaming_long_reads():
    """T2 raises max-lf; under 10% long reads the tree says T4, but max-lf is still what moves work across."""

    def batch(max_lf):  # reads sent to the CPU for length, and the CPU's time, fall as max-lf rises
        n_long, t_cpu = {3.0: (80, 4.0), 4.5: (30, 2.0)}.get(max_lf, (10, 1.1))
        return stats(n_long=n_long, n_cpu=n_long, t_cpu=t_cpu, t_gpu=1.0)

    c = Controller(Settings())
    for _ in range(40):
        c.observe(batch(c.settings.max_lf))
    moves = [(ch.action.knob, ch.action.old, ch.action.new, ch.action.leaf) for ch in c.changes]
    assert moves == [("max_lf", 3.0, 4.5, "T2"), ("max_lf", 4.5, 6.75, "T2")]
    assert c.changes[1].action.why.startswith("carried on") and c.changes[1].effect > 0
    assert c.decision.load == LoadLeaf.BALANCED and c.settings.ultra_thresh == Settings().ultra_thresh


def test_a_load_correction_goes_on_while_the_memory_tree_asks_only_for_what_the_bounds_forbid():
    """B at its bound and the arena still mostly empty: S3 every batch, yet the CPU/GPU split is free to move."""
    most = 8_000_000

    def batch(max_lf):
        n_long, t_cpu = {3.0: (80, 4.0), 4.5: (30, 2.0)}.get(max_lf, (10, 1.1))
        return stats(n_reads=300, n_bases=most, max_bases=most, x_util=0.1, y_util=0.1, n_long=n_long, n_cpu=n_long,
                     t_cpu=t_cpu, t_gpu=1.0)  # fmt: skip

    c = Controller(Settings(max_bases=most), Bounds(max_bases=(100_000, most)))
    for _ in range(40):
        c.observe(batch(c.settings.max_lf))
    assert [(ch.action.knob, ch.action.new) for ch in c.changes] == [("max_lf", 4.5), ("max_lf", 6.75)]
    assert c.decision.memory == MemoryLeaf.S3 and c.decision.load == LoadLeaf.BALANCED


def test_a_split_threshold_that_overshot_comes_back_inside_its_bracket():
    """max-lf up twice sends every long read to the GPU, which is then the slow side: back, between the two."""

    def batch(max_lf):
        n_long, t_cpu, t_gpu = (80, 4.0, 1.0) if max_lf < 4 else (30, 2.0, 1.0) if max_lf < 4.8 else \
            (15, 1.1, 1.0) if max_lf < 6 else (0, 0.05, 2.0)  # fmt: skip
        return stats(n_long=n_long, n_cpu=n_long, t_cpu=t_cpu, t_gpu=t_gpu)

    c = Controller(Settings())
    for _ in range(60):
        c.observe(batch(c.settings.max_lf))
    moves = [(ch.action.knob, ch.action.new, ch.action.leaf) for ch in c.changes]
    assert moves[:2] == [("max_lf", 4.5, "T2"), ("max_lf", 6.75, "T2")] and moves[2][2] == "T5"
    assert len(moves) == 3 and 4.8 <= c.settings.max_lf < 6 and c.decision.load == LoadLeaf.BALANCED


def test_an_over_segmentation_correction_that_overshot_a_little_comes_back_a_little():
    """max-epk 5 -> 6.25 left the GPU slightly slow (f -0.18): max-epk comes back near 6.25, not max-lf down."""

    def batch(max_epk):
        n_events, t_cpu = (3000, 5.0) if max_epk < 5.5 else (170, 0.45) if max_epk > 6.1 else (400, 0.6)
        return stats(n_events=n_events, n_cpu=n_events, t_cpu=t_cpu, t_gpu=0.65)

    c = Controller(Settings())
    for _ in range(40):
        c.observe(batch(c.settings.max_epk))
    moves = [(ch.action.knob, ch.action.new, ch.action.leaf) for ch in c.changes]
    assert moves[0] == ("max_epk", 6.25, "T3") and moves[1][0] == "max_epk" and moves[1][2] == "T5"
    assert 5.5 <= moves[1][1] <= 6.25 / 1.05 and len(moves) == 2
    assert abs(c.decision.measurements.factor) <= 0.15


# ---------------------------------------------------------------- persistence

H100 = GpuInfo("NVIDIA H100 80GB HBM3", 80 * GIB, 79 * GIB, False)


def test_learned_values_round_trip_per_device(tmp_path):
    store = TuningStore(tmp_path / "state")
    other = GpuInfo("NVIDIA GeForce RTX 4090", 24 * GIB, 23 * GIB, False)
    assert store.load(H100) == {}
    learned = Settings(max_reads=3000, max_bases=42_000_000, max_lf=2.25, max_epk=6.25, avg_epk=2.31,
                       ultra_thresh=200_000)  # fmt: skip
    store.save(H100, learned, changes=7)
    store.save(other, Settings(max_reads=900), changes=1)
    again = TuningStore(tmp_path / "state")
    assert Settings(**again.load(H100)) == learned
    assert again.load(other)["max_reads"] == 900
    data = json.loads((tmp_path / "state" / "tuning.json").read_text())
    assert set(data["devices"]) == {H100.key, other.key} and data["devices"][H100.key]["changes"] == 7
    assert H100.key == "NVIDIA H100 80GB HBM3 (81920 MiB)"


def test_bad_learned_values_are_ignored(tmp_path, caplog):
    store = TuningStore(tmp_path)
    store.path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert store.load(H100) == {}
    assert "not read" in caplog.text
    store.path.write_text(json.dumps({"version": 1, "devices": {H100.key: {"settings": {
        "max_reads": -4, "max_lf": "big", "threads": 3, "max_epk": 7, "ultra_thresh": 2.5e5}}}}))
    assert store.load(H100) == {"max_epk": 7.0, "ultra_thresh": 250_000}


def test_learned_values_start_the_next_run_unless_the_user_set_them(tmp_path):
    machine = Machine(H100, 32, 256 * GIB)
    p = plan(machine, learned={"max_reads": 3000, "max_lf": 2.25})
    assert (p.settings.max_reads, p.settings.max_lf, p.sources["max_reads"]) == (3000, 2.25, "learned")
    p = plan(machine, given={"max_reads": 64}, learned={"max_reads": 3000})
    assert (p.settings.max_reads, p.sources["max_reads"]) == (64, "given")
    p = plan(machine, learned={"max_reads": 10**9})
    assert p.settings.max_reads == Bounds().max_reads[1]


def test_the_tuner_saves_after_each_change_and_publishes_every_decision(tmp_path, caplog):
    sent, applied = [], []
    store = TuningStore(tmp_path)
    tuner = AutoTuner(Controller(Settings()), applied.append, publish=sent.append, store=store, gpu=H100)
    with caplog.at_level(logging.INFO, logger="streamer.tuning"):
        for _ in range(5):
            tuner.observe(stats(**T5_BATCH))
    assert [m["kind"] for m in sent] == ["decision"] * 5 + ["change"]
    assert sent[-1]["knob"] == "max_lf" and sent[-1]["new"] == 2.0 and sent[4]["advice"] == ["T5"]
    assert applied == [tuner.settings] and store.load(H100)["max_lf"] == 2.0
    assert "tuning advice after 5 batches in a row (T5)" in caplog.text and "max_lf 3.0 -> 2.0" in caplog.text
    for _ in range(5):
        tuner.observe(stats(t_cpu=0.9, t_gpu=1.0))
    effect = [m for m in sent if m["kind"] == "effect"]
    assert len(effect) == 1 and effect[0]["effect"] == pytest.approx(0.0)  # 3 Mb per s before and after
    assert json.dumps(sent)


def test_a_failing_subscriber_side_never_stops_tuning(caplog):
    def broken(_):
        raise OSError("socket closed")

    tuner = AutoTuner(Controller(Settings()), lambda s: None, publish=broken)
    with caplog.at_level(logging.WARNING):
        for _ in range(6):
            tuner.observe(stats(**T5_BATCH))
    assert tuner.settings.max_lf == 2.0 and caplog.text.count("publishing tuning decisions failed") == 1


def test_tuned_limits_follow_the_tuner():
    tuner = AutoTuner(Controller(Settings(max_reads=64)), lambda s: None)
    limits = TunedLimits(tuner)
    for _ in range(5):
        tuner.observe(stats(n_reads=64, max_reads=64, n_bases=400_000, x_util=0.05, y_util=0.05))
    assert (limits.max_reads, limits.max_bases) == (256, 5_000_000)


# ---------------------------------------------------------------- device profiles


@pytest.mark.parametrize("name, gib, integrated, cpus, expected", [
    ("NVIDIA H100 80GB HBM3", 80, False, 32, "hpc"),
    ("NVIDIA H200", 141, False, 16, "hpc"),
    ("NVIDIA H100 80GB HBM3", 80, False, 8, "workstation"),
    ("NVIDIA A100-SXM4-40GB", 40, False, 64, "hpc"),
    ("NVIDIA GeForce RTX 4090", 24, False, 16, "workstation"),
    ("NVIDIA GeForce RTX 3050 Laptop GPU", 4, False, 8, "laptop"),
    ("NVIDIA GeForce RTX 4080", 16, False, 2, "laptop"),
    ("NVIDIA Tegra X1", 4, True, 4, "jetson-nano"),
    ("NVIDIA Tegra X2", 8, True, 6, "jetson-tx2"),
    ("Xavier", 32, True, 8, "jetson-xavier"),
    ("Orin", 64, True, 12, "jetson-orin"),
    ("NVIDIA Tegra", 16, True, 8, "jetson-xavier"),
])  # fmt: skip
def test_profile_picked_from_the_gpu_and_cpus(name, gib, integrated, cpus, expected):
    machine = Machine(GpuInfo(name, gib * GIB, gib * GIB, integrated), cpus, 64 * GIB)
    assert pick_profile(machine).name == expected


def test_no_gpu_is_the_cpu_profile_with_the_built_in_defaults():
    p = plan(Machine(None, 8, 16 * GIB))
    assert p.profile.name == "cpu" and p.settings == Settings() and p.threads == 8 and p.mem_frac is None


def test_profile_overridden_by_name_and_by_the_users_values():
    machine = Machine(H100, 32, 256 * GIB)
    assert plan(machine).profile.name == "hpc"
    p = plan(machine, "jetson-nano", given={"max_lf": 4.0, "mem_frac": 0.3})
    assert p.profile.name == "jetson-nano"
    assert (p.settings.max_reads, p.settings.max_lf, p.mem_frac, p.threads) == (256, 4.0, 0.3, 4)
    assert p.sources["max_lf"] == "given" and p.sources["max_reads"] == "profile"


def test_values_left_at_their_defaults_count_as_unset():
    defaults = {"max_reads": 512, "max_lf": 3.0, "mem_frac": None}
    assert user_set({"max_reads": 512, "max_lf": 2.0, "mem_frac": None}, defaults) == {"max_lf": 2.0}


def test_every_profile_is_within_the_bounds():
    for p in PROFILES.values():
        s = p.settings
        for knob, (lo, hi) in ((k, getattr(Bounds(), k)) for k in ("max_reads", "max_bases", "max_lf", "max_epk")):
            assert lo <= getattr(s, knob) <= hi, (p.name, knob)
        assert s.avg_epk <= s.max_epk


def test_bounds_keep_batches_within_host_memory_and_twice_the_arena():
    small = plan(Machine(GpuInfo("NVIDIA Tegra X1", 4 * GIB, 3 * GIB, True), 4, 4 * GIB))
    assert small.bounds.max_bases[1] == int(4 * GIB * 0.25 / 400)
    big = plan(Machine(GpuInfo("NVIDIA GeForce RTX 3050 Laptop GPU", 4 * GIB, 2 * GIB, False), 8, 512 * GIB))
    assert big.bounds.max_bases[1] == 2 * arena_capacity(int(2 * GIB * 0.8), 2.0, 100).bases


# ---------------------------------------------------------------- replays (SYNTHETIC COST MODEL)


def _replay(reads: Reads, start: Settings, batches: int = 150, arena: int = 2 * 10**9):
    controller = Controller(start)
    steps = replay(controller, Replay(reads, arena), batches)
    return controller, steps


def _assert_converged(controller, steps, within: int):
    """Changes stop within `within` batches; then CPU and GPU times are within 30% of each other."""
    changed = [i for i, s in enumerate(steps) if s.actions]
    assert changed and changed[-1] < within
    assert len(controller.changes) <= 10
    tail = [s.stats for s in steps[-20:]]
    for st in tail:  # every batch: |f| <= 0.3, the load tree's balance
        assert abs(st.t_cpu - st.t_gpu) <= 0.3 * (st.t_cpu + st.t_gpu)
    cpu, gpu = sum(st.t_cpu for st in tail), sum(st.t_gpu for st in tail)
    assert abs(cpu - gpu) <= 0.3 * max(cpu, gpu)  # and over the window, within 30% of the larger
    knobs = {ch.action.knob for ch in controller.changes}
    for knob in knobs:  # no knob goes back and forth: at most one reversal each
        moves = [np.sign(ch.action.new - ch.action.old) for ch in controller.changes if ch.action.knob == knob]
        assert sum(a != b for a, b in zip(moves, moves[1:])) <= 1, knob


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replay_very_small_k_is_s4_and_autotune_balances(seed):
    reads = Reads.synthetic(20_000, seed=seed)
    controller, steps = _replay(reads, Settings(max_reads=16))
    first = next(s.decision for s in steps if s.decision.advice)
    assert first.advice == (MemoryLeaf.S4,) and first.batch == 5
    _assert_converged(controller, steps, within=80)
    untuned = fixed(Settings(max_reads=16), Replay(reads, 2 * 10**9), 40)
    assert throughput([s.stats for s in steps[-20:]]) > 20 * throughput(untuned)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replay_many_long_reads_is_t5_and_autotune_balances(seed):
    reads = Reads.synthetic(20_000, seed=seed, long_share=0.2)
    controller, steps = _replay(reads, Settings())
    first = next(s.decision for s in steps if s.decision.advice)
    assert first.advice == (LoadLeaf.T5,)  # long reads on the GPU hold its blocks back
    _assert_converged(controller, steps, within=60)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replay_many_over_segmented_reads_is_t3_and_autotune_balances(seed):
    reads = Reads.synthetic(20_000, seed=seed, overseg_share=0.4)
    start = Settings(max_reads=1024, max_bases=8_000_000)
    controller, steps = _replay(reads, start)
    first = next(s.decision for s in steps if s.decision.advice)
    assert first.advice == (LoadLeaf.T3,)
    assert controller.changes[0].action.knob == "max_epk"
    _assert_converged(controller, steps, within=40)


def test_replay_without_autotune_advises_and_changes_nothing():
    reads = Reads.synthetic(5_000)
    controller = Controller(Settings(max_reads=16), policy=Policy(autotune=False))
    steps = replay(controller, Replay(reads, 2 * 10**9), 30)
    assert not any(s.actions for s in steps) and controller.settings == Settings(max_reads=16)
    assert all(s.decision.advice == (MemoryLeaf.S4,) for s in steps[4:])


def test_replay_settings_carry_over_through_the_store(tmp_path):
    """A second run starts from what the first learned, and has nothing left to change."""
    reads = Reads.synthetic(20_000)
    gpu = GpuInfo("Synthetic GPU", 8 * GIB, 8 * GIB, False)
    store = TuningStore(tmp_path)
    first = AutoTuner(Controller(Settings(max_reads=16)), lambda s: None, store=store, gpu=gpu)
    r = Replay(reads, 2 * 10**9)
    for _ in range(100):
        first.observe(r.run_batch(first.settings))
    start = plan(Machine(gpu, 16, 64 * GIB), "laptop", learned=store.load(gpu)).settings
    assert start == first.settings
    second = Controller(start)
    steps = replay(second, Replay(reads, 2 * 10**9), 40)
    assert len(second.changes) <= 1 and not any(s.actions for s in steps[10:])


# ---------------------------------------------------------------- the daemon's wiring


def test_daemon_config_resolves_from_the_profile_except_keys_set(tmp_path, reference_path):
    from streamer import config
    from streamer.tuning.session import plan_config

    flat = {"watch.dir": tmp_path, "reference.genome": reference_path, "output.dir": tmp_path / "out",
            "gpu.profile": "hpc", "gpu.disable": True, "batch.max_bases": 7_000_000, "gpu.max_lf": 3.0}
    cfg, p = plan_config(config.build(flat))
    assert p.profile.name == "hpc" and p.sources["max_bases"] == "given" and p.sources["max_lf"] == "profile"
    assert (cfg.batch.max_reads, cfg.batch.max_bases, cfg.gpu.mem_frac) == (4096, 7_000_000, 0.9)
    assert cfg.pipeline.threads == p.threads >= 1
    cfg, p = plan_config(config.build({**flat, "gpu.profile": "auto"}))
    assert p.profile.name == "cpu" and cfg.batch.max_reads == 512  # no GPU here: the built-in defaults


def test_where_its_profile_has_the_gpu_take_events_the_daemon_leaves_the_split(monkeypatch, tmp_path,
                                                                                reference_path):
    from streamer import config
    from streamer.cli import build_parser
    from streamer.commands.run import cuda_options
    from streamer.tuning import session

    monkeypatch.setattr(session, "probe_gpu", lambda dev_id=0: H100)
    flat = {"watch.dir": tmp_path, "reference.genome": reference_path, "output.dir": tmp_path / "out",
            "gpu.profile": "workstation"}
    cfg, p = session.plan_config(config.build(flat))
    assert (cfg.gpu.events, cfg.gpu.balance, cuda_options(cfg).events) == (True, False, True)
    assert session.AutoTuner.for_gpu(p, object(), autotune=True).controller.policy.balance is False
    cfg, _ = session.plan_config(config.build({**flat, "gpu.events": False, "gpu.balance": True}))
    assert (cfg.gpu.events, cfg.gpu.balance) == (False, True)
    cfg, p = session.plan_config(config.build({**flat, "gpu.profile": "auto"}))  # 2 cores here: a laptop's
    assert (p.profile.name, cfg.gpu.events, cfg.gpu.balance) == ("laptop", False, True)
    # `streamer call` on a backlog: its events stay on the CPU unless asked
    for flags, events in (([], False), (["--cuda-events"], True)):
        args = build_parser().parse_args(["call", "-r", "r.fa", "-b", "r.bam", "-g", "g.fa", "--profile", "hpc",
                                          "--autotune", "--state-dir", str(tmp_path), *flags])  # fmt: skip
        tuning = session.CallTuning.from_args(args)
        assert tuning.plan.gpu.events is events and args.cuda_events is events
        assert tuning.tuner.controller.policy.balance is not events  # the split tuned where events are on the CPU


def test_daemon_takes_new_caps_for_the_next_batch(tmp_path, reference_path):
    from streamer import config
    from streamer.daemon.shell import Daemon

    cfg = config.build({"watch.dir": tmp_path, "reference.genome": reference_path, "output.dir": tmp_path / "out",
                        "batch.max_reads": 64})
    tuner = AutoTuner(Controller(Settings(max_reads=64)), lambda s: None)
    daemon = Daemon(cfg, pipeline=None, reference=None, tuner=tuner)

    class Result:
        gpu_stats = stats(n_reads=64, max_reads=64, n_bases=400_000, x_util=0.05, y_util=0.05)

    for _ in range(5):
        daemon._tune(Result())
    assert daemon.config.batch.max_reads == 256 and daemon.config.batch.max_bases == 5_000_000
    assert tuner.summary()["changes"][0]["knob"] == "max_reads"


# ---------------------------------------------------------------- `streamer call`'s wiring


def test_call_flags_resolve_and_batches_reach_the_tuner_one_behind(monkeypatch, tmp_path):
    from streamer.cli import build_parser
    from streamer.tuning import session

    monkeypatch.setattr(session, "probe_gpu", lambda dev_id=0: H100)
    args = build_parser().parse_args(["call", "-r", "r.fa", "-b", "r.bam", "-g", "g.fa", "-K", "64", "--profile",
                                      "hpc", "--autotune", "--state-dir", str(tmp_path)])  # fmt: skip
    tuning = session.CallTuning.from_args(args)
    assert (args.batchsize, args.max_bases, args.cuda_mem_frac, args.cuda_max_lf) == (64, 20_000_000, 0.9, 3.0)
    limits = tuning.limits(None)
    assert isinstance(limits, TunedLimits) and limits.max_reads == 64

    class Stage:
        options = with_settings(CudaOptions(), tuning.plan.settings)

        def retune(self, options):
            Stage.options = options

    tuning.attach(Stage())
    small = stats(n_reads=64, max_reads=64, n_bases=400_000, x_util=0.05, y_util=0.05)
    for _ in range(5):
        tuning.observe(small)
    assert limits.max_reads == 64  # the fifth batch is held until the next says it was not the last
    tuning.observe(small)
    assert limits.max_reads == Stage.options.max_reads == 256
    tuning.finish()
    assert tuning.tuner.controller.decision.guards == (Guard.LAST_BATCH, Guard.SETTLING)
    assert TuningStore(tmp_path).load(H100)["max_reads"] == 256
    assert tuning.summary()["autotune"] is True


def test_call_without_a_gpu_has_nothing_to_tune(tmp_path):
    from streamer.cli import build_parser
    from streamer.tuning.session import CallTuning

    args = build_parser().parse_args(["call", "-r", "r.fa", "-b", "r.bam", "-g", "g.fa", "--disable-cuda",
                                      "--autotune", "--state-dir", str(tmp_path)])  # fmt: skip
    tuning = CallTuning.from_args(args)
    assert tuning.tuner is None and tuning.summary() is None and args.batchsize == 512
    limits = tuning.limits(object())
    tuning.observe(stats())
    tuning.finish()
    assert not isinstance(limits, TunedLimits) and not (tmp_path / "tuning.json").exists()


def test_call_flag_given_its_builtin_value_still_overrides_the_profile(monkeypatch):
    from streamer.cli import build_parser
    from streamer.tuning import session

    monkeypatch.setattr(session, "probe_gpu", lambda dev_id=0: H100)
    args = build_parser().parse_args(["call", "-r", "r.fa", "-b", "r.bam", "-g", "g.fa", "-B", "5000000",
                                      "--profile", "hpc"])  # fmt: skip
    session.CallTuning.from_args(args)
    assert args.max_bases == 5_000_000  # the hpc profile alone would give 20 M
    assert args.batchsize == PROFILES["hpc"].settings.max_reads  # -K not given: the profile decides
