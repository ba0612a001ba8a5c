"""Acting on the monitor's advice: a pure state machine, `observe(stats) -> list[Action]`.

The paper's monitor only advises; here each advice leaf names a knob to move and which way
(the paper's remedies, in a fixed order), and the controller moves it within safe bounds:

- hysteresis: the trees' own dead bands (70%/30%, |f| <= 0.3), advice only after a leaf's
  fifth batch in a row, a settling batch after each change, and one change at a time. A load
  correction, once advised, is carried through until the mean f over the batches after it is
  within `exit_factor` (0.1): entering at 0.3 and leaving at 0.1 (the slower side at most 1.22
  times the faster), the balance does not end up sitting on the tree's threshold, where noise
  would flip the leaf batch by batch, and single batches stay within 30% of each other;
- no oscillation: every knob keeps a bracket, the highest value the evidence called too low
  and the lowest it called too high. A move never crosses into it; a move back lands inside
  (where f crosses zero, interpolated, for the load knobs; the geometric middle otherwise), so
  each reversal narrows the bracket, and once it is narrower than the smallest step the knob
  stays where it is. Knob by knob the number of changes is bounded;
- effect: every change is measured over the batches that follow it against the batches before
  it (throughput over the batch's stages, f, utilisation), each a window of several batches. One that cost more
  than the noise floor (`Window.noise` of both windows, at least `min_noise`) is undone, its
  value becomes a bracket end, and that direction of that knob is closed (`Closure`): no move
  of any size that way, on any advice, until the measured regime moves (the CPU/GPU time ratio
  by `reopen_ratio` or the mean read length by `reopen_length`, either way). On a GPU much
  faster than the CPU side the paper's load-balance advice can cost throughput; a closed
  direction is how the tuner remembers that, also across starts (`TuningStore`).
- balance (`Policy.balance`): off, the load tree advises and nothing moves the split, while the
  memory tree still shapes the batch: where the daemon's events are on the GPU, its other stages hold
  the host's cores, and moves onto them cost throughput that windows of a few batches could not tell
  from noise (`gpu.balance`).

Measurements, decisions, actions and changes are frozen records; nothing here logs, publishes
or touches a file (`streamer.tuning.session` does that at the edges).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from streamer.pipeline.gpu import AbeaBatchStats
from streamer.tuning.knobs import (
    DOWN,
    INTEGER_KNOBS,
    KNOBS,
    MEMORY_KNOBS,
    REVERT,
    STEP,
    UP,
    Action,
    Bounds,
    Change,
    Closure,
    Policy,
    Settings,
    Window,
)
from streamer.tuning.monitor import (
    ADVICE,
    BOTH_TREES,
    Decision,
    Guard,
    Leaf,
    LoadLeaf,
    Measurements,
    MemoryLeaf,
    Monitor,
    load_leaf,
)

@dataclass
class _Bracket:
    """Values the evidence called too low / too high, with the mean f measured there (None: not a load knob)."""

    low: tuple[float, float | None] | None = None
    high: tuple[float, float | None] | None = None


class Controller:
    """The monitor plus the moves it advises; feed it every batch's GPU ABEA measurements."""

    def __init__(self, settings: Settings, bounds: Bounds = Bounds(), policy: Policy = Policy(),
                 closed: Sequence[Closure] = ()):  # fmt: skip
        self.settings = settings
        self.bounds = bounds
        self.policy = policy
        self.monitor = Monitor(policy.guards)
        self.decision: Decision | None = None  # the latest batch's
        self.changes: list[Change] = []  # every change, measured or not yet
        self.measured: tuple[Change, ...] = ()  # changes whose effect the latest batch completed
        self.stuck: tuple[Leaf, ...] = ()  # the latest batch's advice that no knob could follow
        self.closed: dict[tuple[str, int], Closure] = {(c.knob, c.direction): c for c in closed if c.knob in KNOBS}
        self.closing: tuple[Closure, ...] = ()  # directions the latest batch closed
        self.reopened: tuple[tuple[Closure, str], ...] = ()  # ... and reopened, with why
        self._brackets = {k: _Bracket() for k in KNOBS}
        self._settle = 0
        self._recent: deque[Measurements] = deque(maxlen=policy.effect_batches)
        self._after: list[Decision] = []
        self._pending: int | None = None

    def observe(self, stats: AbeaBatchStats, last: bool = False) -> list[Action]:
        """One batch: decide, measure the last change's effect, and return the change to make (if any)."""
        s = self.settings
        m = Measurements.from_stats(stats, s.max_reads, s.max_bases, last)
        d = self.monitor.observe(m, (Guard.SETTLING,) if self._settle else ())
        self._settle = max(0, self._settle - 1)
        self.decision, self.measured, self.stuck, self.closing, self.reopened = d, (), (), (), ()
        if not BOTH_TREES.intersection(d.guards):
            self._recent.append(m)
            if self._pending is not None:
                self._after.append(d)
            elif len(self._recent) == self._recent.maxlen:
                self._reopen()
        actions: list[Action] = []
        if self._pending is not None and len(self._after) >= self.policy.effect_batches:
            actions = self._measure(d.batch)
        if not actions and self.policy.autotune and d.advice:
            actions = self._follow(d)
        for a in actions:
            self._apply(a)
        return actions

    def summary(self) -> dict[str, Any]:
        """Current settings and every change with its effect, as plain values."""
        return {"settings": self.settings.as_dict(), "changes": [c.as_dict() for c in self.changes],
                "closed": [c.as_dict() for c in self.closed.values()]}  # fmt: skip

    def _reopen(self) -> None:
        """Directions closed under another regime than the one the latest batches show are open again."""
        now = Window.of(self._recent)
        if now is None or now.regime is None:
            return
        reopened = []
        for key, c in list(self.closed.items()):
            why = c.regime.moved(now.regime, self.policy) if c.regime is not None else None
            if why is not None:
                del self.closed[key]
                reopened.append((c, why))
        self.reopened = tuple(reopened)

    # -- effects -------------------------------------------------------------

    def _measure(self, batch: int) -> list[Action]:
        after = self._after
        change = replace(self.changes[self._pending], after=Window.of([d.measurements for d in after]))
        self.changes[self._pending] = change
        self.measured = (change,)
        self._pending, self._after = None, []
        a, effect = change.action, change.effect
        if a.leaf == REVERT:
            return []
        noise = change.noise_floor(self.policy)
        if effect is None or effect >= -noise:
            return self._carry_on(batch, a, change.after, after)
        br = self._brackets[a.knob]
        direction = UP if a.new > a.old else DOWN
        if direction == UP:
            br.high = (a.new, None) if br.high is None else min(br.high, (a.new, None), key=lambda e: e[0])
        else:
            br.low = (a.new, None) if br.low is None else max(br.low, (a.new, None), key=lambda e: e[0])
        closure = Closure(a.knob, direction, a.old, batch, effect, noise, change.before.regime if change.before else None)
        self.closed[(a.knob, direction)] = closure
        self.closing = (closure,)
        return [Action(batch, a.knob, a.new, a.old, REVERT,
                       f"{a.leaf} cost {-effect:.0%} of throughput (noise floor {noise:.0%}): {a.knob} {closure.way} closed")]

    def _carry_on(self, batch: int, prev: Action, window: Window, after: list[Decision]) -> list[Action]:
        """After a change, batches that still lean one way by more than exit_factor: the next load move.

        Only once the memory tree is content over those batches, or asks only for what the bounds
        forbid (the batch shape is settled), and the load tree looked at each of them (none too
        small to time). The knob just moved goes on first while it still moves work off the slow
        side: once a long-read correction brings the share of long reads under the tree's 10%, the
        tree says T4 (nothing to blame) although max-lf is still what moves work across; and a move
        that overshot comes back inside its bracket.
        """
        if not (self.policy.autotune and self.policy.balance) or any(
                d.load is None or not self._memory_settled(d) for d in after):
            return []
        last = after[-1].measurements
        leaf = load_leaf(last, window.factor, self.policy.exit_factor)
        if leaf == LoadLeaf.BALANCED:
            return []
        why = f"carried on: mean f {window.factor:+.2f} over {window.batches} batches"
        same = _same_knob(prev, leaf, last)
        moves = [(same[0], prev.knob, same[1], None)] if same is not None else []
        moves += [(leaf, knob, direction, target) for knob, direction, target, _ in self._remedies(leaf, last)]
        for follows, knob, direction, target in moves:
            action = self._move(batch, follows, knob, direction, target, why)
            if action is not None:
                return [action]
        return []

    def _memory_settled(self, d: Decision) -> bool:
        """No memory advice, or advice every remedy of which has its knob at the bound (S3 with B at its most)."""
        if d.memory not in ADVICE:
            return True
        for knob, direction, _, _ in self._remedies(d.memory, d.measurements):
            lo, hi = self.bounds.of(knob, self.settings)
            v = getattr(self.settings, knob)
            if (direction == UP and v < hi) or (direction == DOWN and v > lo):
                return False
        return True

    def _apply(self, a: Action) -> None:
        self.settings = replace(self.settings, **{a.knob: a.new})
        if a.knob in MEMORY_KNOBS:  # a new batch shape: where the load knobs balanced is to be found again
            for knob in KNOBS:
                if knob not in MEMORY_KNOBS:
                    self._brackets[knob] = _Bracket()
        self.changes.append(Change(a, Window.of(self._recent)))
        self._pending, self._after = len(self.changes) - 1, []
        self._recent.clear()
        self.monitor.reset()
        self._settle = self.policy.settle_batches

    # -- remedies ------------------------------------------------------------

    def _follow(self, d: Decision) -> list[Action]:
        stuck = []
        for leaf in d.advice:
            if isinstance(leaf, LoadLeaf) and not self.policy.balance:
                continue
            for knob, direction, target, why in self._remedies(leaf, d.measurements):
                action = self._move(d.batch, leaf, knob, direction, target, why)
                if action is not None:
                    return [action]
            stuck.append(leaf)
        self.stuck = tuple(stuck)
        return []

    def _remedies(self, leaf: Leaf, m: Measurements) -> list[tuple[str, int, float | None, str]]:
        """The paper's remedies for a leaf, as (knob, direction, target or None for a step, why), first choice first."""
        s, p = self.settings, self.policy
        # events per base of this batch's GPU reads: X and Y were sized with Y = avg_epk X
        mu = s.avg_epk * m.y_util / m.x_util if m.x_util > 0 else None
        epk = mu * (1 + p.epk_headroom) if mu else None
        grow = min(p.max_growth, max(1 + 2 * p.min_step, p.target_util / max(m.x_util, m.y_util, 1e-9)))
        fits = (m.n_reads - m.n_memout) / m.n_reads if m.n_reads else 1.0
        match leaf:
            case MemoryLeaf.S1:
                return [("avg_epk", DOWN, epk, "partition for the events per base measured"),
                        ("max_epk", UP, None, "send more over-segmented reads to the GPU")]  # fmt: skip
            case MemoryLeaf.S2:
                return [("avg_epk", UP, epk, "partition for the events per base measured"),
                        ("max_epk", DOWN, None, "send fewer over-segmented reads to the GPU")]  # fmt: skip
            case MemoryLeaf.S3:
                return [("max_bases", UP, s.max_bases * grow, f"fill {p.target_util:.0%} of the arena")]
            case MemoryLeaf.S4:
                return [("max_reads", UP, s.max_reads * grow, f"fill {p.target_util:.0%} of the arena")]
            case LoadLeaf.T1:
                why = "batch no larger than what fitted the arena"
                caps = [("max_reads", DOWN, m.n_reads * fits, why)] if m.n_reads >= m.max_reads else []
                if m.n_bases >= m.max_bases or not caps:
                    caps.append(("max_bases", DOWN, m.n_bases * fits, why))
                return caps
            case LoadLeaf.T2:
                return [("max_lf", UP, None, "send more long reads to the GPU")]
            case LoadLeaf.T3:
                return [("max_epk", UP, None, "send more over-segmented reads to the GPU")]
            case LoadLeaf.T4:
                return [("ultra_thresh", DOWN, None, "set more long reads aside until the batch is done")]
            case LoadLeaf.T5:
                ultra = [("ultra_thresh", UP, None, "align ultra-long reads beside the GPU")] if m.n_ultra else []
                return ultra + [("max_lf", DOWN, None, "send more long reads to the CPU"),
                                ("max_epk", DOWN, None, "send more over-segmented reads to the CPU")]  # fmt: skip
        return []

    def _move(self, batch: int, leaf: Leaf, knob: str, direction: int, target: float | None,
              why: str) -> Action | None:  # fmt: skip
        """The bracketed, bounded move of `knob`, or None where it cannot or need not move."""
        s, p = self.settings, self.policy
        if (knob, direction) in self.closed:
            return None
        v = float(getattr(s, knob))
        lo, hi = self.bounds.of(knob, s)
        br = self._brackets[knob]
        f = sum(m.factor for m in self._recent) / len(self._recent) if isinstance(leaf, LoadLeaf) and self._recent \
            else None  # fmt: skip
        if direction == UP:
            if br.low is None or v >= br.low[0]:
                br.low = (v, f)
            t = target if target is not None else v * STEP[knob]
            if br.high is not None and t >= br.high[0] / (1 + p.min_step):
                t = _between(br.low, br.high, p.min_step)
            t = None if t is None else min(t, hi)
        else:
            if br.high is None or v <= br.high[0]:
                br.high = (v, f)
            t = target if target is not None else v / STEP[knob]
            if br.low is not None and t <= br.low[0] * (1 + p.min_step):
                t = _between(br.low, br.high, p.min_step)
            t = None if t is None else max(t, lo)
        if t is None:
            return None
        new = int(round(t)) if knob in INTEGER_KNOBS else round(float(t), 3)
        if (new - v) * direction <= 0 or abs(math.log(new / v)) < math.log1p(p.min_step):
            return None
        return Action(batch, knob, getattr(s, knob), new, str(leaf), why)


LOAD_LEAVES = frozenset(str(leaf) for leaf in LoadLeaf if leaf != LoadLeaf.BALANCED)
CPU_SLOW = frozenset({LoadLeaf.T1, LoadLeaf.T2, LoadLeaf.T3, LoadLeaf.T4})


def _same_knob(prev: Action, leaf: LoadLeaf, m: Measurements) -> tuple[LoadLeaf, int] | None:
    """The leaf and direction for moving prev's split threshold again, where it still moves work off the slow side.

    After a max-lf (max-epk) move, the CPU still slow with reads still sent to it for length
    (events): up, as T2 (T3) would; the GPU slow: down, as T5 would. Whichever way prev went, so
    a move that overshot comes back inside its bracket rather than handing over to another knob.
    """
    if prev.leaf not in LOAD_LEAVES or prev.knob not in ("max_lf", "max_epk"):
        return None
    if leaf in CPU_SLOW:
        counted = m.n_long if prev.knob == "max_lf" else m.n_events
        return ((LoadLeaf.T2 if prev.knob == "max_lf" else LoadLeaf.T3), UP) if counted > 0 else None
    if leaf == LoadLeaf.T5:
        return LoadLeaf.T5, DOWN
    return None


def _between(low: tuple[float, float | None], high: tuple[float, float | None], min_step: float) -> float | None:
    """A value strictly inside the bracket: where f crosses zero if both ends have f of opposite signs.

    Never next to an end: at least a fifth of the bracket, and at least min_step, from either
    (so each move back narrows the bracket, and no interpolated point is too close to take).
    """
    (lv, lf), (hv, hf) = low, high
    width = math.log(hv) - math.log(lv)
    if width <= 2 * math.log1p(min_step):
        return None
    w = lf / (lf - hf) if lf is not None and hf is not None and lf * hf < 0 else 0.5
    edge = max(0.2, 1.01 * math.log1p(min_step) / width)
    w = min(max(w, edge), 1 - edge)
    return math.exp(math.log(lv) + w * width)
