"""Device profiles (f5c's `-x`): where the settings start on a class of machine, picked from the board
(a Jetson's, `streamer.tuning.board`), else the GPU and CPUs.

`plan` resolves every tunable setting once at start, first match wins: a value the user set,
the value learned on this GPU in an earlier run (autotune), the profile's. It also sets the
bounds the controller keeps to on this machine. A flag or key left at its built-in default
counts as not set (`user_set`), so a copy of the shipped defaults file does not pin every setting.

A profile also sets the host memory budget (`pipeline.memory_budget`, `--memory-budget`);
`memory_plan` derives from a budget the batch cap B, the batches read ahead, the batches in the
stages at once and whether signal readers may be processes, so that peak memory follows the
budget and not the input's size.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from streamer.pipeline.gpu import CudaOptions, GpuInfo, gpu_package
from streamer.tuning.board import Board, jetson_profile, read_board
from streamer.tuning.knobs import KNOBS, Bounds, Settings

# host bytes a batch holds per read base while it is assembled, prefetched and computed (signal,
# events, pairs); batches may take a quarter of the host's memory
HOST_BYTES_PER_BASE = 400
HOST_SHARE = 0.25
# band width the arena is sized for (the ABEA default)
BANDWIDTH = 100
# names in lower case that mark data-centre GPUs whatever their memory
DATACENTRE = ("tesla", "a100", "a30", "a40", "h100", "h200", "h800", "gh200", "b100", "b200", "l40", "v100", "p100")


# What a run holds besides its batches, measured with `streamer call` warm on 2 cores (summed PSS):
# the process itself with numpy, numba, the kernels loaded and the models (134 MB); a reader process
# (numpy, h5py, pod5 imported; about 30 MB each beside the 75 MB fork server); a batch in flight,
# per read base (signal raw and in pA, events, pairs, the HMM's windows: 110-170 B measured)
PROCESS_BYTES = 150 << 20
READER_PROCESS_BYTES = 40 << 20
FORK_SERVER_BYTES = 75 << 20
BATCH_BYTES_PER_BASE = 260
# below this budget readers are threads and one batch is read ahead and one computed at a time
SMALL_BUDGET = 1 << 30
MIN_BATCH_BASES = 20_000  # a budget smaller than the process needs still gets batches this big
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes of a size such as `300M`, `2G`, `1.5g`, `512MiB` or a plain number of bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a size: {text!r} (e.g. 300M, 2G)")
    return int(float(m.group(1)) * 1024 ** "_kmgt".index((m.group(2) or "_").lower()))


def budget_bytes(text: str, profile: Profile, threads: int) -> int:
    """The budget `pipeline.memory_budget` (`--memory-budget`) names: a size, or `auto`, the profile's."""
    return profile.memory_budget(threads) if text == "auto" else parse_size(text)


@dataclass(frozen=True)
class MemoryPlan:
    """What a memory budget allows: the batch cap B, batches read ahead and in the stages, reader kind."""

    budget: int
    max_bases: int
    ahead: int
    compute_threads: int
    io_mode: str  # "threads" where reader processes do not fit; else as asked
    tight_heap: bool  # return freed batch arrays to the system at once (`RunnerOptions.tight_heap`)


def memory_plan(budget: int, max_bases: int, compute_threads: int, io_workers: int, io_mode: str = "auto") -> MemoryPlan:
    """B, read-ahead, compute threads and reader kind for `budget` bytes (B never above `max_bases`).

    Batches in flight are those the batch driver allows (`RunnerOptions.limit`: read ahead, one
    being packed, one queued and one computing per compute thread); each may hold
    `BATCH_BYTES_PER_BASE` per base of what the process and its readers leave of the budget.
    """
    small = budget < SMALL_BUDGET
    ahead, compute_threads = (1, 1) if small else (2, compute_threads)
    if small and io_mode == "auto":
        io_mode = "threads"
    readers = 0 if io_mode == "threads" else FORK_SERVER_BYTES + io_workers * READER_PROCESS_BYTES
    in_flight = ahead + 1 + 2 * compute_threads
    room = (budget - PROCESS_BYTES - readers) // (in_flight * BATCH_BYTES_PER_BASE)
    return MemoryPlan(budget, int(min(max_bases, max(MIN_BATCH_BASES, room))), ahead, compute_threads, io_mode, small)


@dataclass(frozen=True)
class Machine:
    gpu: GpuInfo | None
    cpus: int
    host_bytes: int
    board: Board | None = None  # a Jetson's identity (None: not a Jetson)

    @classmethod
    def this(cls, gpu: GpuInfo | None) -> Machine:
        """This host, with the GPU `streamer_gpu.device.probe_gpu` found (or None)."""
        try:
            host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            host = 8 << 30
        return cls(gpu, os.cpu_count() or 1, host, read_board())


@dataclass(frozen=True)
class Profile:
    """Starting settings for a class of machine; threads are every core, up to max_threads."""

    name: str
    what: str
    max_reads: int
    max_bases: int
    mem_frac: float | None
    max_threads: int | None = None
    memory: int = 2 << 30  # host memory budget, bytes
    memory_per_thread: int = 0  # added for every thread beyond 4
    avg_epk: float = 2.0
    max_lf: float = 3.0
    max_epk: float = 5.0
    ultra_thresh: int = 100_000

    @property
    def settings(self) -> Settings:
        return Settings(self.max_reads, self.max_bases, self.max_lf, self.max_epk, self.avg_epk, self.ultra_thresh)

    def threads(self, cpus: int) -> int:
        return min(cpus, self.max_threads) if self.max_threads else cpus

    def memory_budget(self, threads: int) -> int:
        """The budget for a run on `threads` threads."""
        return self.memory + self.memory_per_thread * max(0, threads - 4)


# Jetsons share the host's memory with the GPU, hence the smaller arenas; the caps grow with the
# memory of each class (f5c's profiles scale them alike). None of the jetson-* values is measured on
# a board yet: the Orin Nano and NX entries are placed by memory beside the TX2 (8 GB) and Xavier
# (16 GB) ones, the Nano's arena share kept at the Nano's so that a basecaller has room beside it.
PROFILES = {p.name: p for p in (
    Profile("jetson-nano", "Jetson Nano: 4 cores, 4 GB shared with the GPU", 256, 1_500_000, 0.5, 4, 512 << 20),
    Profile("jetson-tx2", "Jetson TX2: 6 cores, 8 GB shared", 512, 2_500_000, 0.6, 6, 1 << 30),
    Profile("jetson-xavier", "Jetson AGX Xavier: 8 cores, 16-32 GB shared", 1024, 5_000_000, 0.6, 8, 2 << 30,
            max_epk=6.25),
    Profile("jetson-orin-nano", "Jetson Orin Nano: 6 cores, 4-8 GB shared (unmeasured)", 512, 2_500_000, 0.5, 6,
            1 << 30),
    Profile("jetson-orin-nx", "Jetson Orin NX: 6-8 cores, 8-16 GB shared (unmeasured)", 1024, 5_000_000, 0.6, 8,
            2 << 30),
    Profile("jetson-orin", "Jetson AGX Orin: 12 cores, 32-64 GB shared", 2048, 10_000_000, 0.6, 12, 4 << 30),
    Profile("laptop", "laptop or small GPU (up to 8 GB), or few CPU cores", 512, 5_000_000, 0.8, None, 1 << 30),
    Profile("workstation", "desktop or workstation GPU (8-40 GB)", 1024, 10_000_000, 0.9, None, 2 << 30),
    Profile("hpc", "data-centre GPU (40 GB or more, A100/H100/H200...) with 16 cores or more", 4096, 20_000_000, 0.9,
            None, 3 << 30),
    Profile("cpu", "no GPU: ABEA on the CPU", 512, 5_000_000, None, None, 300 << 20, 64 << 20),
)}  # fmt: skip
PROFILE_NAMES = tuple(PROFILES)


def pick_profile(machine: Machine) -> Profile:
    """The profile for a Jetson board (its model, else its memory), else for the GPU found (name,
    memory, integrated or not) and the CPU count."""
    if machine.board is not None:
        return PROFILES[jetson_profile(machine.board.model, machine.host_bytes, machine.board.release_major)]
    g = machine.gpu
    if g is None:
        return PROFILES["cpu"]
    name, gib = g.name.lower(), g.total_bytes / 2**30
    if g.integrated or any(w in name for w in ("tegra", "jetson", "orin", "xavier")):
        return PROFILES[jetson_profile(g.name, g.total_bytes)]
    if gib <= 8.5 or any(w in name for w in ("laptop", "mobile", "max-q")) or machine.cpus < 4:
        return PROFILES["laptop"]
    if (gib >= 39 or any(w in name for w in DATACENTRE)) and machine.cpus >= 16:
        return PROFILES["hpc"]
    return PROFILES["workstation"]


def bounds_for(machine: Machine, mem_frac: float | None) -> Bounds:
    """Safe ranges on this machine: B within a share of host memory and twice what the arena holds."""
    most_bases = int(machine.host_bytes * HOST_SHARE / HOST_BYTES_PER_BASE)
    if machine.gpu is not None:
        frac = mem_frac if mem_frac is not None else (0.7 if machine.gpu.integrated else 0.9)
        arena_bases = gpu_package().arena_bases(int(machine.gpu.free_bytes * frac), Settings().avg_epk, BANDWIDTH)
        most_bases = min(most_bases, 2 * arena_bases)
    b = Bounds()
    return replace(b, max_bases=(b.max_bases[0], max(b.max_bases[0], min(b.max_bases[1], most_bases))))


@dataclass(frozen=True)
class Plan:
    """The settings a run starts from, where each came from, and the bounds the controller keeps to."""

    machine: Machine
    profile: Profile
    settings: Settings
    threads: int
    mem_frac: float | None
    bounds: Bounds
    sources: Mapping[str, str]

    def cuda_options(self, base: CudaOptions) -> CudaOptions:
        """base (device, disable) with this plan's memory share, split thresholds and caps."""
        return with_settings(replace(base, mem_frac=self.mem_frac), self.settings)

    def limits(self) -> dict[str, Any]:
        """Every limit the plan sets, by its configuration name: the batch caps, the GPU split, threads,
        the arena's share of free GPU memory (None: the built-in share) and the profile's memory budget
        in bytes (what `pipeline.memory_budget: auto` takes)."""
        return {**self.settings.as_dict(), "threads": self.threads, "mem_frac": self.mem_frac,
                "memory_budget": self.profile.memory_budget(self.threads)}

    def as_dict(self) -> dict[str, Any]:
        """The plan as summary.json records it, for `streamer status` and the metrics."""
        board = self.machine.board
        return {"name": self.profile.name, "what": self.profile.what, "board": board.describe() if board else None,
                "limits": self.limits(), "sources": dict(self.sources)}

    def describe(self) -> str:
        s = self.settings
        given = [k for k, v in self.sources.items() if v != "profile"]
        board = f" on {self.machine.board.describe()}" if self.machine.board else ""
        return (f"profile {self.profile.name} ({self.profile.what}){board}: K {s.max_reads}, B {s.max_bases}, "
                f"max-lf {s.max_lf:g}, max-epk {s.max_epk:g}, avg-epk {s.avg_epk:g}, ultra-thresh {s.ultra_thresh}, "
                f"threads {self.threads}, mem-frac {self.mem_frac if self.mem_frac is not None else 'default'}"
                + (f"; not from the profile: {', '.join(f'{k} ({self.sources[k]})' for k in given)}" if given else ""))


def user_set(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The values that differ from their built-in defaults: what `plan` takes as set by the user."""
    return {k: v for k, v in values.items() if v is not None and v != defaults.get(k)}


def with_settings(cuda: CudaOptions, s: Settings) -> CudaOptions:
    """cuda with the tunable settings s (the caps are recorded with each batch's measurements)."""
    return replace(cuda, avg_epk=s.avg_epk, max_lf=s.max_lf, max_epk=s.max_epk, ultra_thresh=s.ultra_thresh,
                   max_reads=s.max_reads, max_bases=s.max_bases)  # fmt: skip


def plan(machine: Machine, profile: str = "auto", given: Mapping[str, Any] | None = None,
         learned: Mapping[str, Any] | None = None) -> Plan:  # fmt: skip
    """Settings from the profile (`auto`: picked for the machine), learned values, then the user's.

    `given` maps knob names (and `threads`, `mem_frac`) to the values the user set (see `user_set`);
    `learned` comes from `TuningStore.load` and is kept within this machine's bounds.
    """
    prof = pick_profile(machine) if profile == "auto" else PROFILES[profile]
    given = dict(given or {})
    mem_frac = given.get("mem_frac") if given.get("mem_frac") is not None else prof.mem_frac
    threads = given.get("threads") or prof.threads(machine.cpus)
    bounds = bounds_for(machine, mem_frac)
    start = prof.settings
    values, sources = {}, {}
    for knob in KNOBS:
        if given.get(knob) is not None:
            values[knob], sources[knob] = given[knob], "given"
        elif learned and knob in learned:
            lo, hi = getattr(bounds, knob)
            values[knob], sources[knob] = type(getattr(start, knob))(min(max(learned[knob], lo), hi)), "learned"
        else:
            values[knob], sources[knob] = getattr(start, knob), "profile"
    if values["avg_epk"] > values["max_epk"] and sources["avg_epk"] != "given":
        values["avg_epk"] = values["max_epk"]
    return Plan(machine, prof, Settings(**values), threads, mem_frac, bounds, sources)
