"""Device profiles (f5c's `-x`): where the settings start on a class of machine, picked from the board
(a Jetson's, `streamer.tuning.board`), else the GPU and CPUs.

`plan` resolves every tunable setting once at start, first match wins: a value the user set,
the value learned on this GPU in an earlier run (autotune), the profile's. It also sets the
bounds the controller keeps to on this machine. A flag or key left at its built-in default
counts as not set (`user_set`), so a copy of the shipped defaults file does not pin every setting.

A profile also sets the memory budget (`pipeline.memory_budget`, `--memory-budget`);
`memory_plan` derives from a budget the batch cap B, the batches read ahead, the batches in the
stages at once and whether signal readers may be processes, so that peak memory follows the
budget and not the input's size. On a Jetson (a `unified` profile) the GPU's memory is the host's:
the budget is one for both, and the plan gives the GPU part (the arena sized for B, the HMM's
buffers, the kernel modules) its share of it (`MemoryPlan.gpu_bytes`, the arena's cap). The jetson
profiles also hold device memory back for the live basecaller (`gpu.reserve`), launch on
low-priority CUDA streams (`gpu.stream_priority`) and leave cores to MinKNOW (`spare_cores`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
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


# What a run holds besides its batches, and each batch in flight per base of B, fitted to summed PSS
# (`streamer call`, warm) at two batch caps each, 7 batches in flight: on 2 cores (CPU stages, 2 reader
# processes) 69-79 bytes a base and 360 MB besides, of which the process itself with numpy, numba, the
# kernels and the models about 230 MB; on a 16-core H200 box (GPU stages, 16 reader processes) 106 bytes a
# base and 870 MB besides. A reader process costs about 40 MB beside its 75 MB fork server. A batch's
# bytes per base (signal raw and in pA, events, pairs, the HMM's windows) carry a margin over the larger fit.
PROCESS_BYTES = 230 << 20
READER_PROCESS_BYTES = 40 << 20
FORK_SERVER_BYTES = 75 << 20
BATCH_BYTES_PER_BASE = 130
# Where ABEA runs on a discrete GPU its bands and the HMM's windows stay on the device: on the 16-core H200
# box (`streamer call` at B 2.4-6M, 15 runs) a batch in flight held 33 bytes a base (38 at most) with its
# events' starts, lengths and spreads let go after the scalings, 63 with them kept; the process held 1.46 GB
# besides its batches, its readers 0.53-0.65 GB of it, and itself the CUDA context, numba-cuda and the
# kernels' modules beside what a CPU run holds.
GPU_BATCH_BYTES_PER_BASE = 75
GPU_PROCESS_BYTES = 650 << 20
# a batch's events' starts (int64), lengths and spreads (float32), at about 1.75 events a base: not made
# where no sink renders them (`Sink.needs_events`; the fit above measured them let go after the scalings)
EVENT_BYTES_PER_BASE = 28
# the daemon's basecalls waiting for their signal, per base (the sequence and its alignment records: 1.9
# bytes measured), and the share of the budget they may take
CACHED_BYTES_PER_BASE = 2
CACHE_SHARE = 0.1
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


def budget_bytes(text: str | int, profile: Profile, threads: int) -> int:
    """The budget `pipeline.memory_budget` (`--memory-budget`) names: a size, or `auto`, the profile's."""
    return profile.memory_budget(threads) if text == "auto" else parse_size(text)


@dataclass(frozen=True)
class MemoryPlan:
    """What a memory budget allows: the batch cap B, batches read ahead and in the stages, reader kind, and on
    a board whose GPU shares the host's memory the GPU part's share (None elsewhere)."""

    budget: int
    max_bases: int
    ahead: int
    compute_threads: int
    io_mode: str  # "threads" where reader processes do not fit; else as asked
    tight_heap: bool  # return freed batch arrays to the system at once (`RunnerOptions.tight_heap`)
    gpu_bytes: int | None = None  # the most device memory the process may take (`CudaOptions.memory_cap`)
    most_bases: int | None = None  # the largest B the budget holds, whatever B is asked: the tuner's bound


@dataclass(frozen=True)
class DeviceShare:
    """The GPU part of a budget shared with the host: its bytes for batches of B bases, and a cap on them."""

    bytes_for: Callable[[int], int]
    cap: int | None = None


def memory_plan(budget: int, max_bases: int, compute_threads: int, io_workers: int, io_mode: str = "auto",
                device: DeviceShare | None = None, held: int = 0, *, discrete_gpu: bool = False,
                events: bool = True) -> MemoryPlan:  # fmt: skip
    """B, read-ahead, compute threads and reader kind for `budget` bytes (B never above `max_bases`).

    Batches in flight are those the batch driver allows (`RunnerOptions.limit`: read ahead, one
    being packed, one queued and one computing per compute thread); each may hold
    `batch_bytes_per_base` per base of what the process, its readers and `held` (what else the caller
    keeps: the daemon's basecall cache, `cache_bases`) leave of the budget. events: a sink renders
    the events, so batches keep them. discrete_gpu: ABEA runs on a GPU of its own memory, where a
    batch holds fewer bytes and the process `GPU_PROCESS_BYTES` more: B is the larger of that account
    and the host's, which a budget too small for the GPU's process (a laptop's 1G) keeps, as planned
    before the GPU's was measured, rather than batches too small to keep a GPU busy. With
    `device` (host and GPU are one memory), B is the largest whose batches and GPU part fit the
    budget together, the GPU part within its cap; what the host part leaves is the GPU's share.
    """
    small = budget < SMALL_BUDGET
    ahead, compute_threads = (1, 1) if small else (2, compute_threads)
    if small and io_mode == "auto":
        io_mode = "threads"
    readers = 0 if io_mode == "threads" else FORK_SERVER_BYTES + io_workers * READER_PROCESS_BYTES
    in_flight = ahead + 1 + 2 * compute_threads
    per_base = in_flight * batch_bytes_per_base(False, events)
    room = budget - PROCESS_BYTES - readers - held
    most = Bounds().max_bases[1]
    if device is None:
        fit = room // per_base
        if discrete_gpu:
            fit = max(fit, (room - GPU_PROCESS_BYTES) // (in_flight * batch_bytes_per_base(True, events)))
        fit = max(MIN_BATCH_BASES, fit)
        return MemoryPlan(budget, int(min(max_bases, fit)), ahead, compute_threads, io_mode, small,
                          most_bases=int(min(most, fit)))  # fmt: skip

    def fits(b: int) -> bool:
        gpu = device.bytes_for(b)
        return b * per_base + gpu <= room and (device.cap is None or gpu <= device.cap)

    def largest(cap: int) -> int:
        """The largest B up to cap that fits, MIN_BATCH_BASES at least (the GPU part grows with B)."""
        lo, hi = MIN_BATCH_BASES, max(MIN_BATCH_BASES, cap)
        if fits(hi):
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    b = largest(max_bases)
    gpu_bytes = max(0, room - b * per_base)
    if device.cap is not None:
        gpu_bytes = min(gpu_bytes, device.cap)
    return MemoryPlan(budget, b, ahead, compute_threads, io_mode, small, gpu_bytes, largest(most))


def batch_bytes_per_base(discrete_gpu: bool = False, events: bool = True) -> int:
    """Host bytes a batch in flight may hold per base: less where ABEA's bands are on a discrete GPU, and
    where no sink renders the events."""
    kept = GPU_BATCH_BYTES_PER_BASE if discrete_gpu else BATCH_BYTES_PER_BASE
    return kept if events else kept - EVENT_BYTES_PER_BASE


def cache_bases(budget: int, max_pending_bases: int) -> int:
    """The daemon's bound on basecalls waiting for their signal (`join.max_pending_bases`), within its share
    of the budget (they take `CACHED_BYTES_PER_BASE` each); beyond it the oldest are dropped and their file
    read again when their signal lands."""
    return min(max_pending_bases, int(budget * CACHE_SHARE) // CACHED_BYTES_PER_BASE)


@dataclass(frozen=True)
class Machine:
    gpu: GpuInfo | None
    cpus: int
    host_bytes: int
    board: Board | None = None  # a Jetson's identity (None: not a Jetson)

    @classmethod
    def this(cls, gpu: GpuInfo | None) -> Machine:
        """This host, with the GPU `streamer_gpu.device.probe_gpu` found (or None); its cores are those
        this process may run on (`taskset`, a cgroup's cpuset, systemd's `CPUAffinity=`)."""
        try:
            host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            host = 8 << 30
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return cls(gpu, cores or 1, host, read_board())


@dataclass(frozen=True)
class Profile:
    """Starting settings for a class of machine; threads are every core but spare_cores, up to max_threads.

    unified: host and GPU are one memory (a Jetson's), so the memory budget is one for both;
    gpu_reserve: device bytes never taken (`gpu.reserve`); stream_priority: of the GPU stages' CUDA streams;
    events: the daemon detects events on the GPU (`gpu.events`), where it has memory to spare for their
    buffers (about 1.1 GB a lane) and is not the live basecaller's first.
    """

    name: str
    what: str
    max_reads: int
    max_bases: int
    mem_frac: float | None
    max_threads: int | None = None
    memory: int = 2 << 30  # memory budget, bytes (host, and GPU where unified)
    memory_per_thread: int = 0  # added for every thread beyond 4
    avg_epk: float = 2.0
    max_lf: float = 3.0
    max_epk: float = 5.0
    ultra_thresh: int = 100_000
    unified: bool = False
    gpu_reserve: int = 0
    spare_cores: int = 0  # cores left to other work (MinKNOW's)
    stream_priority: str = "normal"
    events: bool = False

    @property
    def settings(self) -> Settings:
        return Settings(self.max_reads, self.max_bases, self.max_lf, self.max_epk, self.avg_epk, self.ultra_thresh)

    def threads(self, cpus: int) -> int:
        left = max(1, cpus - self.spare_cores)
        return min(left, self.max_threads) if self.max_threads else left

    def memory_budget(self, threads: int) -> int:
        """The budget for a run on `threads` threads."""
        return self.memory + self.memory_per_thread * max(0, threads - 4)


def _jetson(name: str, what: str, max_reads: int, max_bases: int, mem_frac: float, max_threads: int, memory: int,
            reserve: int, **kw: Any) -> Profile:  # fmt: skip
    """A Jetson's profile: one memory for host and GPU, `reserve` bytes of it left to the live basecaller,
    low-priority CUDA streams, two cores left to MinKNOW."""
    return Profile(name, what, max_reads, max_bases, mem_frac, max_threads, memory, unified=True, gpu_reserve=reserve,
                   spare_cores=2, stream_priority="low", **kw)  # fmt: skip


# Jetsons share the host's memory with the GPU, hence the smaller arenas; the caps grow with the
# memory of each class (f5c's profiles scale them alike). None of the jetson-* values is measured on
# a board yet: the Orin Nano and NX entries are placed by memory beside the TX2 (8 GB) and Xavier
# (16 GB) ones. Each budget is host and GPU together (about a quarter of the board's memory, the
# GPU's part included); each reserve about the memory a live basecaller holds on such a board.
GIB = 1 << 30
PROFILES = {p.name: p for p in (
    _jetson("jetson-nano", "Jetson Nano: 4 cores, 4 GB shared with the GPU", 256, 1_500_000, 0.5, 4, GIB, GIB),
    _jetson("jetson-tx2", "Jetson TX2: 6 cores, 8 GB shared", 512, 2_500_000, 0.6, 6, 3 * GIB // 2, 2 * GIB),
    _jetson("jetson-xavier", "Jetson AGX Xavier: 8 cores, 16-32 GB shared", 1024, 5_000_000, 0.6, 8, 3 * GIB, 3 * GIB,
            max_epk=6.25),
    _jetson("jetson-orin-nano", "Jetson Orin Nano: 6 cores, 4-8 GB shared (unmeasured)", 512, 2_500_000, 0.5, 6,
            2 * GIB, 3 * GIB),
    _jetson("jetson-orin-nx", "Jetson Orin NX: 6-8 cores, 8-16 GB shared (unmeasured)", 1024, 5_000_000, 0.6, 8,
            3 * GIB, 4 * GIB),
    _jetson("jetson-orin", "Jetson AGX Orin: 12 cores, 32-64 GB shared", 2048, 10_000_000, 0.6, 12, 6 * GIB, 8 * GIB),
    Profile("laptop", "laptop or small GPU (up to 8 GB), or few CPU cores", 512, 5_000_000, 0.8, None, 1 << 30),
    Profile("workstation", "desktop or workstation GPU (8-40 GB)", 1024, 10_000_000, 0.9, None, 2 << 30,
            events=True),
    Profile("hpc", "data-centre GPU (40 GB or more, A100/H100/H200...) with 16 cores or more", 4096, 20_000_000, 0.9,
            None, 3 << 30, events=True),
    Profile("cpu", "no GPU: ABEA on the CPU", 512, 5_000_000, None, None, 300 << 20, 64 << 20),
)}  # fmt: skip
PROFILE_NAMES = tuple(PROFILES)
# the limits besides the knobs, threads and mem_frac that a user may set (`plan`'s `given`)
LIMIT_KEYS = ("memory_budget", "gpu_reserve", "gpu_memory", "stream_priority", "gpu_events", "gpu_balance")


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


@dataclass(frozen=True)
class GpuLimits:
    """What the GPU stages may take and how they launch: device bytes never taken (`gpu.reserve`), the most
    the process takes (`gpu.memory`; None: mem_frac alone, or on a Jetson the budget's share), the
    priority of their CUDA streams (`gpu.stream_priority`), whether the daemon detects events there (`gpu.events`;
    `streamer call` when asked), and whether the tuner moves the CPU/GPU split on the load tree's advice
    (`gpu.balance`)."""

    reserve: int = 0
    memory: int | None = None
    stream_priority: str = "normal"
    events: bool = False
    balance: bool = True


def bounds_for(machine: Machine, mem_frac: float | None, gpu: GpuLimits = GpuLimits()) -> Bounds:
    """Safe ranges on this machine: B within a share of host memory and twice what the arena holds."""
    most_bases = int(machine.host_bytes * HOST_SHARE / HOST_BYTES_PER_BASE)
    if machine.gpu is not None:
        frac = mem_frac if mem_frac is not None else (0.7 if machine.gpu.integrated else 0.9)
        room = int(max(0, machine.gpu.free_bytes - gpu.reserve) * frac)
        room = min(room, gpu.memory) if gpu.memory is not None else room
        arena_bases = gpu_package().arena_bases(room, Settings().avg_epk, BANDWIDTH)
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
    budget: int = 0  # the memory budget, bytes (host, and GPU where the profile is unified)
    gpu: GpuLimits = GpuLimits()

    def device_share(self, cuda: CudaOptions) -> DeviceShare | None:
        """The GPU part of the budget (`memory_plan`'s `device`) where host and GPU are one memory and the GPU
        is used; None elsewhere. cuda: the stages' options, whose batch cap B the plan varies."""
        gpu = self.machine.gpu
        if not self.profile.unified or gpu is None or cuda.disable:
            return None
        package = gpu_package()
        return DeviceShare(lambda b: package.device_bytes(replace(cuda, max_bases=b), BANDWIDTH, gpu.resident_threads),
                           self.gpu.memory)  # fmt: skip

    def discrete_gpu(self, cuda: CudaOptions) -> bool:
        """Whether the stages' ABEA runs on a GPU of its own memory (`memory_plan`'s discrete_gpu)."""
        return self.machine.gpu is not None and not cuda.disable and not self.profile.unified

    def budgeted(self, memory: MemoryPlan) -> Plan:
        """This plan with the budget a run was sized for, B's bound within it (so the tuner never grows batches
        past the budget) and B itself the budget's (the tuner starts from it: its first move must not take B
        back to the profile's), and on a unified board the GPU part's share as its cap."""
        cap = memory.gpu_bytes if memory.gpu_bytes is not None else self.gpu.memory
        lo, hi = self.bounds.max_bases
        bounds = self.bounds if memory.most_bases is None else replace(
            self.bounds, max_bases=(lo, max(lo, min(hi, memory.most_bases))))  # fmt: skip
        settings = replace(self.settings, max_bases=min(self.settings.max_bases, memory.max_bases))
        return replace(self, budget=memory.budget, gpu=replace(self.gpu, memory=cap), bounds=bounds,
                       settings=settings)

    def with_events(self, events: bool) -> Plan:
        """This plan with its events on the GPU or not, and the split tuned only where they are not (unless
        `gpu_balance` was given): events on the GPU leave the host's cores to the daemon's other stages, which
        then bound it, and moving long reads onto those cores cost a PromethION's rate 12%; with the events on
        the CPU it changed nothing (benchmarks/RESULTS-cpu-half.md)."""
        balance = self.gpu.balance if self.sources.get("gpu_balance") == "given" else not events
        return replace(self, gpu=replace(self.gpu, events=events, balance=balance))

    def limits(self) -> dict[str, Any]:
        """Every limit the plan sets, by its configuration name: the batch caps, the GPU split, threads, the
        arena's share of free GPU memory (None: the built-in share), the memory budget in bytes, whether it
        holds the GPU's memory too, the device bytes never taken, the most the GPU part takes (None: no cap
        beyond mem_frac) and the CUDA streams' priority."""
        g = self.gpu
        return {**self.settings.as_dict(), "threads": self.threads, "mem_frac": self.mem_frac,
                "memory_budget": self.budget, "unified_memory": self.profile.unified, "gpu_reserve": g.reserve,
                "gpu_memory": g.memory, "stream_priority": g.stream_priority, "gpu_events": g.events,
                "gpu_balance": g.balance}  # fmt: skip

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
                f"threads {self.threads}, mem-frac {self.mem_frac if self.mem_frac is not None else 'default'}, "
                f"budget {_mb(self.budget)}{' (host and GPU)' if self.profile.unified else ''}, GPU reserve "
                f"{_mb(self.gpu.reserve)}, GPU cap {_mb(self.gpu.memory) if self.gpu.memory is not None else 'none'}, "
                f"{self.gpu.stream_priority}-priority streams, events on the {'GPU' if self.gpu.events else 'CPU'}, "
                f"split {'tuned' if self.gpu.balance else 'advised on'}"
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

    `given` maps knob names (and `threads`, `mem_frac`, `memory_budget`, `gpu_reserve`, `gpu_memory`,
    `stream_priority`, `gpu_events`, `gpu_balance`; sizes as numbers of bytes or text such as `2G`) to the values
    the user set (see `user_set`); `learned` comes from `TuningStore.load` and is kept within this machine's bounds.
    """
    prof = pick_profile(machine) if profile == "auto" else PROFILES[profile]
    given = {k: v for k, v in (given or {}).items() if v != "auto"}
    mem_frac = given.get("mem_frac") if given.get("mem_frac") is not None else prof.mem_frac
    threads = given.get("threads") or prof.threads(machine.cpus)
    budget = prof.memory_budget(threads) if given.get("memory_budget") is None else parse_size(given["memory_budget"])
    events = machine.gpu is not None and prof.events if given.get("gpu_events") is None else given["gpu_events"]
    gpu = GpuLimits(parse_size(given.get("gpu_reserve", prof.gpu_reserve)),
                    parse_size(given["gpu_memory"]) if given.get("gpu_memory") is not None else None,
                    given.get("stream_priority", prof.stream_priority),
                    balance=given.get("gpu_balance", True))  # unless given, `with_events` sets it below
    bounds = bounds_for(machine, mem_frac, gpu)
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
    sources.update({k: "given" for k in ("threads", "mem_frac", *LIMIT_KEYS) if given.get(k) is not None})
    return Plan(machine, prof, Settings(**values), threads, mem_frac, bounds, sources, budget, gpu).with_events(events)


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB"
