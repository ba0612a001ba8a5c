"""When a replay's files land, and the pace it kept: pure plans, so a pace is testable without waiting.

A batch lands when its last read ended (relative to the run's first read) divided by `speed`,
every `interval` seconds, or when the bases of it and the batches before it would have been
sequenced at `mbases_per_s` (24 is a PromethION 48 at typical yield). Both the writing replay
and the fast one (pre-written files moved in) follow the same plan and report the same pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplayOptions:
    speed: float = 1.0  # 0: as fast as possible
    interval: float | None = None  # fixed seconds between batches, instead of the recorded pace
    mbases_per_s: float | None = None  # the pace set by each batch's bases, instead of the recorded pace
    batch_reads: int = 4000
    mode: str = "move"  # move | inplace
    write_seconds: float = 0.0  # in place: spread writing each file over this long
    basecall_lag: float = 0.0  # seconds after its signal file that a batch's basecalls land (may be < 0)
    bam: bool = True
    compression: str = "vbz"  # FAST5 only
    signal_format: str = "fast5"  # fast5 | pod5 | blow5
    flowcell: str = "FAK00000"


@dataclass(frozen=True)
class BatchTiming:
    """What the pace of one batch depends on."""

    end_s: float  # when its last read ended, in seconds after the run's first read started
    bases: int  # its basecalls' length


@dataclass(frozen=True)
class Landing:
    """One file of the replay and when it lands, in seconds after the replay starts."""

    at: float
    batch: int
    kind: str  # signal | fastq | bam


def landing_times(batches: Sequence[BatchTiming], opts: ReplayOptions) -> list[float]:
    """When each batch's signal file lands."""
    if opts.interval is not None:
        return [i * opts.interval for i in range(len(batches))]
    if opts.mbases_per_s:
        done, out = 0, []
        for b in batches:
            done += b.bases
            out.append(done / (opts.mbases_per_s * 1e6))
        return out
    if opts.speed > 0:
        return [b.end_s / opts.speed for b in batches]
    return [0.0] * len(batches)


def plan(batches: Sequence[BatchTiming], opts: ReplayOptions, bam: bool) -> list[Landing]:
    """Every file of every batch and when it lands: the signal at its time, the basecalls `basecall_lag` after."""
    out = []
    for i, at in enumerate(landing_times(batches, opts)):
        out.append(Landing(at, i, "signal"))
        out.append(Landing(max(0.0, at + opts.basecall_lag), i, "fastq"))
        if bam:
            out.append(Landing(max(0.0, at + opts.basecall_lag), i, "bam"))
    return sorted(out, key=lambda x: (x.at, x.batch, x.kind != "signal"))


@dataclass(frozen=True)
class Pace:
    """The pace a replay kept, against the pace it was asked for."""

    batches: int
    bases: int
    seconds: float  # from the start to the final summary
    asked_seconds: float  # when the plan's last file was due

    @classmethod
    def kept(cls, batches: Sequence[BatchTiming], landings: Sequence[Landing], seconds: float) -> Pace:
        return cls(len(batches), sum(b.bases for b in batches), seconds, landings[-1].at if landings else 0.0)

    @property
    def mbases_per_s(self) -> float:
        return self.bases / 1e6 / self.seconds if self.seconds > 0 else float("inf")

    @property
    def behind(self) -> bool:
        """Later than asked by more than scheduling noise (5 % and 0.1 s)."""
        return self.asked_seconds > 0 and self.seconds > 1.05 * self.asked_seconds + 0.1

    def line(self) -> str:
        return (f"replayed {self.batches} batches, {self.bases / 1e6:.2f} Mbases in {self.seconds:.2f} s: "
                f"{self.mbases_per_s:.2f} Mbases/s")

    def warning(self) -> str | None:
        if not self.behind:
            return None
        asked = self.bases / 1e6 / self.asked_seconds
        return (f"the replay fell behind: asked {asked:.2f} Mbases/s ({self.asked_seconds:.2f} s), "
                f"kept {self.mbases_per_s:.2f} Mbases/s ({self.seconds:.2f} s)")


def follow(landings: Iterable[Landing], land: Callable[[Landing], None], t0: float, *,
           sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
    """Land each file at its time after `t0` (on `clock`), at once when late."""
    for landing in landings:
        wait = landing.at - (clock() - t0)
        if wait > 0:
            sleep(wait)
        land(landing)
