"""The tuner's knobs and what it remembers of them: the settings it moves and their bounds, its
policy, and the records of its moves (actions, the measured windows around them, their effects
and the directions a measured loss closed). Plain data, shared by the controller that decides
(`streamer.tuning.controller`), the profiles that start it and the store that keeps what it learned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from streamer.tuning.monitor import GuardLimits, Measurements

KNOBS = ("max_reads", "max_bases", "max_lf", "max_epk", "avg_epk", "ultra_thresh")
INTEGER_KNOBS = frozenset({"max_reads", "max_bases", "ultra_thresh"})
MEMORY_KNOBS = frozenset({"max_reads", "max_bases", "avg_epk"})  # the batch's shape and the arena's
# how far a knob moves at once when the advice does not say how far
STEP = {"max_reads": 2.0, "max_bases": 2.0, "max_lf": 1.5, "max_epk": 1.25, "avg_epk": 1.25, "ultra_thresh": 2.0}
REVERT = "revert"
UP, DOWN = 1, -1


@dataclass(frozen=True)
class Settings:
    """The tunable settings (paper Table 4 but threads): caps K and B, the split thresholds, the arena's avg-epk."""

    max_reads: int = 512
    max_bases: int = 5_000_000
    max_lf: float = 3.0
    max_epk: float = 5.0
    avg_epk: float = 2.0
    ultra_thresh: int = 100_000

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Bounds:
    """(lowest, highest) the controller may set each knob to; avg-epk stays at or below max-epk."""

    max_reads: tuple[int, int] = (16, 65_536)
    max_bases: tuple[int, int] = (100_000, 500_000_000)
    max_lf: tuple[float, float] = (1.0, 20.0)
    max_epk: tuple[float, float] = (1.5, 15.0)
    avg_epk: tuple[float, float] = (0.5, 10.0)
    ultra_thresh: tuple[int, int] = (10_000, 10_000_000)

    def of(self, knob: str, s: Settings) -> tuple[float, float]:
        lo, hi = getattr(self, knob)
        if knob == "avg_epk":
            hi = min(hi, s.max_epk)
        elif knob == "max_epk":
            lo = max(lo, s.avg_epk)
        return lo, hi


@dataclass(frozen=True)
class Policy:
    autotune: bool = True  # False: advise only, as f5c does
    balance: bool = True  # False: the load tree advises only (the CPU/GPU split stays), the memory tree acts
    settle_batches: int = 1  # batches after a change that may have been assembled or run before it
    effect_batches: int = 4  # batches over which a change's effect is measured
    min_noise: float = 0.05  # the noise floor of a measured effect is never taken below this share
    noise_z: float = 2.0  # ...and is this many standard errors of the difference of two windows' rates
    reopen_ratio: float = 2.0  # a closed direction reopens when the CPU/GPU time ratio moves this many times
    reopen_length: float = 1.5  # ...or the mean read length moves this many times
    min_step: float = 0.05  # no knob moves by less than this fraction: its bracket is settled
    max_growth: float = 4.0  # K or B grow at most this many times at once
    target_util: float = 0.85  # S3/S4 grow the batch towards this arena fill
    epk_headroom: float = 0.05  # S1/S2 partition the arena for the measured events per base plus this
    exit_factor: float = 0.10  # a load correction goes on until the mean |f| after it is this small
    guards: GuardLimits = field(default_factory=GuardLimits)


@dataclass(frozen=True)
class Action:
    """Set `knob` from `old` to `new` from this batch on, following advice `leaf` (or undoing a change)."""

    batch: int
    knob: str
    old: float
    new: float
    leaf: str
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "change", **asdict(self)}


@dataclass(frozen=True)
class Regime:
    """What a measured effect holds for: the CPU side's time over the GPU side's, and the mean read length."""

    cpu_gpu: float
    read_length: float

    def moved(self, other: Regime, policy: Policy) -> str | None:
        """Why `other` is another regime than this one, or None."""
        for name, a, b, limit in (("CPU/GPU time ratio", self.cpu_gpu, other.cpu_gpu, policy.reopen_ratio),
                                  ("mean read length", self.read_length, other.read_length, policy.reopen_length)):
            if a > 0 and b > 0 and max(a / b, b / a) >= limit:
                return f"{name} {a:.3g} -> {b:.3g}"
        return None


@dataclass(frozen=True)
class Window:
    """Batches under one setting: throughput (bases over `Measurements.seconds`), mean f and utilisations.

    noise: the relative standard error of the window's throughput, from its batches' spread.
    """

    batches: int
    rate: float
    factor: float
    x_util: float
    y_util: float
    noise: float = 0.0
    regime: Regime | None = None

    @classmethod
    def of(cls, ms: Sequence[Measurements]) -> Window | None:
        if not ms:
            return None
        seconds = sum(m.seconds for m in ms)
        n = len(ms)
        rates = [m.n_bases / m.seconds for m in ms if m.seconds > 0]
        mean = sum(rates) / len(rates) if rates else 0.0
        noise = 0.0
        if len(rates) > 1 and mean > 0:
            sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (len(rates) - 1))
            noise = sd / mean / math.sqrt(len(rates))
        t_cpu, t_gpu = sum(m.t_cpu for m in ms), sum(m.t_gpu for m in ms)
        regime = Regime(t_cpu / t_gpu if t_gpu > 0 else 0.0, sum(m.n_bases for m in ms) / max(1, sum(m.n_reads for m in ms)))
        return cls(n, sum(m.n_bases for m in ms) / seconds if seconds > 0 else 0.0, sum(m.factor for m in ms) / n,
                   sum(m.x_util for m in ms) / n, sum(m.y_util for m in ms) / n, noise, regime)  # fmt: skip


@dataclass(frozen=True)
class Change:
    """An applied action with the batches before it and, once measured, after it."""

    action: Action
    before: Window | None
    after: Window | None = None

    @property
    def effect(self) -> float | None:
        """Relative change in throughput (0.25: a quarter faster)."""
        if self.before is None or self.after is None or self.before.rate <= 0:
            return None
        return self.after.rate / self.before.rate - 1

    def noise_floor(self, policy: Policy) -> float:
        """The smallest loss told from noise: noise_z standard errors of the difference, at least min_noise."""
        se = math.hypot(self.before.noise if self.before else 0.0, self.after.noise if self.after else 0.0)
        return max(policy.min_noise, policy.noise_z * se)

    def as_dict(self) -> dict[str, Any]:
        return {**self.action.as_dict(), "kind": "effect",
                "before": asdict(self.before) if self.before else None,
                "after": asdict(self.after) if self.after else None, "effect": self.effect}  # fmt: skip


@dataclass(frozen=True)
class Closure:
    """A direction of a knob closed by a measured loss: `knob` moves no further `direction` (UP 1, DOWN -1)
    from `value` while the regime stays near `regime`."""

    knob: str
    direction: int
    value: float
    batch: int
    effect: float
    noise: float
    regime: Regime | None

    @property
    def way(self) -> str:
        return "up" if self.direction == UP else "down"

    def why(self) -> str:
        return f"{self.knob} {self.way} from {self.value:g} cost {-self.effect:.0%} (noise floor {self.noise:.0%})"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "closed", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Closure:
        r = d.get("regime")
        return cls(str(d["knob"]), int(d["direction"]), float(d["value"]), int(d.get("batch", 0)),
                   float(d["effect"]), float(d["noise"]), Regime(**r) if isinstance(r, dict) else None)  # fmt: skip
