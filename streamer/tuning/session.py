"""The controller at the edges: the GPU found, the learned values read, decisions logged and published,
changes applied to the pipeline and kept for the next start.
"""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from streamer.pipeline import timeline
from streamer.pipeline.batching import BatchLimits
from streamer.pipeline.gpu import AbeaBatchStats, CudaOptions, GpuInfo, gpu_package
from streamer.paths import user_state_dir
from streamer.pore.modeltext import scan_lines
from streamer.tuning.controller import Controller
from streamer.tuning.knobs import Action, Policy, Settings
from streamer.tuning.monitor import ADVICE, REPEATS
from streamer.tuning.profiles import PROFILE_NAMES, Machine, MemoryPlan, Plan, plan, user_set, with_settings
from streamer.tuning.store import TuningStore

log = logging.getLogger(__name__)
C = TypeVar("C", bound="TunableConfig")


class GpuStage(Protocol):
    """What the tuner needs of the GPU ABEA stage (`streamer_gpu.abea.CudaAbea`)."""

    options: CudaOptions

    def retune(self, options: CudaOptions) -> None: ...


class TunableConfig(Protocol):
    """What `plan_config` needs of the daemon's configuration (`streamer.config.Config`), named here so
    that the configuration, which lists this package's profiles, is not imported back."""

    gpu: Any  # streamer.config.GpuConfig: device, profile, disable, autotune

    def state_dir(self) -> Path: ...

    def tunables(self) -> dict[str, Any]: ...

    def with_tunables(self: C, values: dict[str, Any]) -> C: ...


def plan_config(cfg: C) -> tuple[C, Plan]:
    """The daemon's configuration with every tunable setting resolved: keys left at their defaults take
    the learned value (autotune) or the profile's."""
    given = user_set(cfg.tunables(), type(cfg)().tunables())
    dev_id = CudaOptions().with_devices(cfg.gpu.device).dev_id  # the profiles plan for the first GPU
    p = prepare(given, cfg.gpu.profile, dev_id=dev_id, disable_cuda=cfg.gpu.disable,
                state_dir=cfg.state_dir() if cfg.gpu.autotune else None)  # fmt: skip
    return cfg.with_tunables(p.limits()), p


def probe_gpu(dev_id: int = 0) -> GpuInfo | None:
    """The GPU the profiles plan for (`streamer_gpu.device.probe_gpu`), None where there is none."""
    return gpu_package().probe_gpu(dev_id)


def first_gpu(args: argparse.Namespace) -> int:
    """The GPU of `--cuda-dev-id` the profiles plan for: the first it names."""
    return CudaOptions().with_devices(args.cuda_dev_id).dev_id


def probe_ahead(dev_id: int = 0) -> Future:
    """`probe_gpu` begun now on a thread of its own, for `prepare`: the driver's start and the device's
    context (most of a second on a GPU box, with the GIL let go) overlap what a command reads before it
    plans."""
    probed: Future = Future()

    def probe() -> None:
        try:
            probed.set_result(probe_gpu(dev_id))
        except BaseException as exc:  # noqa: BLE001 - raised where the answer is taken
            probed.set_exception(exc)

    threading.Thread(target=probe, name="gpu-probe", daemon=True).start()
    return probed


def _start_numba() -> None:
    """Load numba's CPU target now (its code generator and runtime, paid by whichever kernel is dispatched
    first: a tenth of a second on a GPU box; the model parser's here), so that it fills the wait for the
    GPU probe, whose driver calls let the GIL go."""
    scan_lines(np.frombuffer(b"#k 1", np.uint8))


def prepare(given: Mapping[str, Any], profile: str = "auto", *, dev_id: int = 0, disable_cuda: bool = False,
            state_dir: Path | None = None, probed: Future | None = None) -> Plan:  # fmt: skip
    """Probe the GPU (or take the answer of `probed`, a `probe_ahead` of dev_id), read what was learned on
    it (when state_dir is given), and plan the start."""
    if probed is not None and not disable_cuda and not probed.done():
        with timeline.span("numba start"):
            _start_numba()
    with timeline.span("gpu probe"):  # what is left of it
        gpu = None if disable_cuda else probed.result() if probed is not None else probe_gpu(dev_id)
    learned = TuningStore(state_dir).load(gpu) if state_dir is not None and gpu is not None else {}
    p = plan(Machine.this(gpu), profile, given, learned)
    if gpu is not None or p.machine.board is not None:
        log.info("%s: %s", gpu.key if gpu is not None else "no GPU", p.describe())
    return p


class AutoTuner:
    """Feed it each batch's GPU ABEA measurements; it logs, publishes and (with autotune) retunes."""

    def __init__(self, controller: Controller, apply: Callable[[Settings], None], *,
                 publish: Callable[[Mapping[str, Any]], None] | None = None, store: TuningStore | None = None,
                 gpu: GpuInfo | None = None):  # fmt: skip
        self.controller = controller
        self._apply = apply
        self._publish = publish
        self._store = store if gpu is not None else None
        self._gpu = gpu
        self._publish_failed = False
        self._stuck_said: set[object] = set()  # advice with no setting left to change, said once per run

    @classmethod
    def for_gpu(cls, p: Plan, gpu: GpuStage | None, *, autotune: bool, settle_batches: int = 1,
                state_dir: Path | None = None,
                publish: Callable[[Mapping[str, Any]], None] | None = None) -> AutoTuner | None:  # fmt: skip
        """A tuner over a pipeline's GPU stage (`Pipeline.gpu`), or None when ABEA runs on the CPU only.

        settle_batches: how many batches may already be assembled when a change is made.
        """
        if gpu is None:
            return None

        def apply(s: Settings) -> None:
            gpu.retune(with_settings(gpu.options, s))

        return cls.from_plan(p, apply, autotune=autotune, settle_batches=settle_batches, state_dir=state_dir,
                             publish=publish)  # fmt: skip

    @classmethod
    def from_plan(cls, p: Plan, apply: Callable[[Settings], None], *, autotune: bool, settle_batches: int,
                  state_dir: Path | None, publish: Callable[[Mapping[str, Any]], None] | None = None) -> AutoTuner:
        """A tuner starting from the plan's settings and, under autotune, the directions closed on this GPU before."""
        store = TuningStore(state_dir) if autotune and state_dir is not None and p.machine.gpu is not None else None
        closed = store.load_closed(p.machine.gpu) if store is not None else ()
        policy = Policy(autotune=autotune, balance=p.gpu.balance, settle_batches=settle_batches)
        controller = Controller(p.settings, p.bounds, policy, closed)
        return cls(controller, apply, publish=publish, store=store, gpu=p.machine.gpu)

    @property
    def settings(self) -> Settings:
        return self.controller.settings

    def observe(self, stats: AbeaBatchStats, last: bool = False) -> list[Action]:
        """One batch's measurements through the controller; its decision and any change go out."""
        c = self.controller
        actions = c.observe(stats, last)
        d = c.decision
        log.debug("tuning: %s", d.summary())
        self._send(d.as_dict())
        for leaf, run in ((d.memory, d.memory_run), (d.load, d.load_run)):
            if leaf in d.advice and run == REPEATS + 2:
                log.info("tuning advice after %d batches in a row (%s): %s [%s]", run, leaf, ADVICE[leaf],
                         d.summary())  # fmt: skip
        self._stuck_said &= set(d.advice)
        for leaf in c.stuck:
            if leaf not in self._stuck_said:
                self._stuck_said.add(leaf)
                log.info("tuning: no setting left to change for %s (%s)", leaf, ADVICE[leaf])
        for change in c.measured:
            a, effect = change.action, change.effect
            log.info("tuning: %s %s -> %s (%s): throughput %s over %d batches", a.knob, a.old, a.new, a.leaf,
                     "unmeasured" if effect is None else f"{effect:+.0%}",
                     change.after.batches if change.after else 0)  # fmt: skip
            self._send(change.as_dict())
        for closure in c.closing:
            log.info("tuning: %s: closed until the CPU/GPU time ratio or the mean read length moves %gx / %gx",
                     closure.why(), c.policy.reopen_ratio, c.policy.reopen_length)  # fmt: skip
            self._send(closure.as_dict())
        for closure, why in c.reopened:
            log.info("tuning: %s %s open again: %s", closure.knob, closure.way, why)
            self._send({**closure.as_dict(), "kind": "reopened", "why": why})
        for a in actions:
            log.info("tuning: %s %s -> %s (%s: %s)", a.knob, a.old, a.new, a.leaf, a.why)
            self._send(a.as_dict())
        if actions:
            self._stuck_said.clear()
            self._apply(c.settings)
        if (actions or c.reopened) and self._store is not None:
            self._store.save(self._gpu, c.settings, len(c.changes), c.closed.values())
        return actions

    def summary(self) -> dict[str, Any]:
        return {"autotune": self.controller.policy.autotune, **self.controller.summary()}

    def _send(self, message: Mapping[str, Any]) -> None:
        if self._publish is None:
            return
        try:
            self._publish(message)
        except Exception as exc:  # noqa: BLE001 - subscribers are optional consumers
            if not self._publish_failed:
                log.warning("publishing tuning decisions failed (%s); tuning goes on", exc)
                self._publish_failed = True


class TunedLimits(BatchLimits):
    """Batch caps K and B that follow the tuner's settings.

    Batch planning reads `max_reads` and `max_bases` at every record, so a change reaches every
    batch planned after it; a `BatchLimits` itself, for code that takes one.
    """

    def __init__(self, tuner: AutoTuner):
        object.__setattr__(self, "_tuner", tuner)

    @property
    def max_reads(self) -> int:
        return self._tuner.settings.max_reads

    @property
    def max_bases(self) -> int:
        return self._tuner.settings.max_bases


# `streamer call`'s argument (dest) of each tunable setting
CALL_ARGS = {"max_reads": "batchsize", "max_bases": "max_bases", "max_lf": "cuda_max_lf", "max_epk": "cuda_max_epk",
             "avg_epk": "cuda_avg_epk", "ultra_thresh": "ultra_thresh", "threads": "threads",
             "mem_frac": "cuda_mem_frac", "memory_budget": "memory_budget", "gpu_reserve": "gpu_reserve",
             "gpu_memory": "gpu_memory", "stream_priority": "gpu_stream_priority"}  # fmt: skip
# batches `streamer call` may have planned or started before a change reaches them: read ahead (3),
# queued for the stages (2), in them (2), waiting to be written in order (1), held until the next one
# says it was not the last (1), and one to spare
CALL_SETTLE_BATCHES = 10


def add_call_arguments(p: argparse.ArgumentParser) -> None:
    """`streamer call`'s tuning flags; added last, so the flags they resolve already have their defaults."""
    g = p.add_argument_group("tuning (f5c's tuning monitor; it advises in the log, and acts with --autotune)")
    g.add_argument("--profile", choices=("auto", *PROFILE_NAMES), default="auto",
                   help="device profile that -K, -B, -t and the GPU settings start from, like f5c's -x; a flag set "
                        "to other than its default overrides it [auto: picked from the GPU and the CPU count]")
    g.add_argument("--autotune", action="store_true",
                   help="tune -K, -B, max-lf, max-epk, avg-epk and ultra-thresh while running, on the monitor's "
                        "advice; what is learned is kept per GPU in --state-dir for the next run")
    g.add_argument("--state-dir", type=Path, help="where --autotune keeps learned values "
                   "[$XDG_STATE_HOME/streamer, or ~/.local/state/streamer]")  # fmt: skip
    # An unset flag is None, so a flag given explicitly wins even when its value is the built-in one;
    # the help keeps showing the built-in default.
    for action in p._actions:
        if action.dest in CALL_ARGS.values():
            if action.help:
                action.help = action.help.replace("%(default)s", str(action.default))
            action.default = None


class CallTuning:
    """`streamer call`'s side: the plan resolved into the command's arguments, the tuner applied to the
    GPU stage once the pipeline has one, and each batch passed on once it is known not to be the last."""

    def __init__(self, p: Plan, autotune: bool, state_dir: Path | None):
        self.plan = p
        self._gpu: GpuStage | None = None
        self._held: AbeaBatchStats | None = None
        self.tuner: AutoTuner | None = None
        if p.machine.gpu is not None:
            self.tuner = AutoTuner.from_plan(p, self._apply, autotune=autotune, settle_batches=CALL_SETTLE_BATCHES,
                                             state_dir=state_dir)  # fmt: skip

    @classmethod
    def from_args(cls, args: argparse.Namespace, probed: Future | None = None) -> CallTuning:
        """Plan from the profile, learned values (--autotune) and the flags given; the flags' values become the
        plan's. `probed`: the GPU probed ahead (`probe_ahead(first_gpu(args))`)."""
        given = {k: getattr(args, dest) for k, dest in CALL_ARGS.items() if getattr(args, dest) is not None}
        state_dir = (args.state_dir or user_state_dir()) if args.autotune else None
        p = prepare(given, args.profile, dev_id=first_gpu(args), disable_cuda=args.disable_cuda, state_dir=state_dir,
                    probed=probed)  # fmt: skip
        # events on the CPU unless asked: on a backlog every core is the run's, and its large batches queued for
        # the GPU's one events lane (the 66 Mbases on an H200: 6.1 s against 5.1; benchmarks/RESULTS-cpu-half.md)
        p = p.with_events(args.cuda_events)
        resolved = p.limits()
        for k, dest in CALL_ARGS.items():
            setattr(args, dest, resolved[k])
        return cls(p, args.autotune, state_dir)

    def limits(self, limits: BatchLimits) -> BatchLimits:
        """The caps to plan batches with: the tuner's own, followed live, under --autotune."""
        autotune = self.tuner is not None and self.tuner.controller.policy.autotune
        return TunedLimits(self.tuner) if autotune else limits

    def budgeted(self, memory: MemoryPlan) -> None:
        """The run's memory plan: its budget, GPU share and bound on B, which the tuner keeps to from its start."""
        self.plan = self.plan.budgeted(memory)
        if self.tuner is not None:
            c = self.tuner.controller
            c.bounds = self.plan.bounds
            c.settings = replace(c.settings, max_bases=min(c.settings.max_bases, c.bounds.max_bases[1]))

    def attach(self, gpu: GpuStage | None) -> None:
        """The pipeline's GPU ABEA stage (None: ABEA on the CPU, nothing to tune)."""
        self._gpu = gpu

    def observe(self, stats: AbeaBatchStats | None) -> None:
        """A batch's measurements, in batch order; the batch before it goes to the tuner now."""
        if self.tuner is None or stats is None:
            return
        if self._held is not None:
            self.tuner.observe(self._held)
        self._held = stats

    def finish(self) -> None:
        """The run is over: its last batch goes to the tuner as such."""
        if self._held is not None:
            self.tuner.observe(self._held, last=True)
            self._held = None

    def summary(self) -> dict[str, Any] | None:
        return self.tuner.summary() if self.tuner is not None else None

    def _apply(self, s: Settings) -> None:
        if self._gpu is not None:
            self._gpu.retune(with_settings(self._gpu.options, s))
