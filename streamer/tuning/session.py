"""The controller at the edges: the GPU found, the learned values read, decisions logged and published,
changes applied to the pipeline and kept for the next start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from streamer.assemble import BatchLimits
from streamer.config import Config
from streamer.gpu.device import GpuInfo, probe_gpu
from streamer.gpu.options import AbeaBatchStats, CudaOptions
from streamer.tuning.controller import Action, Controller, Policy, Settings
from streamer.tuning.monitor import ADVICE, REPEATS
from streamer.tuning.profiles import Machine, Plan, plan, user_set, with_settings
from streamer.tuning.store import TuningStore

log = logging.getLogger(__name__)


class GpuStage(Protocol):
    """What the tuner needs of the GPU ABEA stage (`streamer.gpu.abea.CudaAbea`)."""

    options: CudaOptions

    def retune(self, options: CudaOptions) -> None: ...


# where each tunable setting lives in the daemon's configuration
CONFIG_KEYS = {"max_reads": ("batch", "max_reads"), "max_bases": ("batch", "max_bases"), "max_lf": ("gpu", "max_lf"),
               "max_epk": ("gpu", "max_epk"), "avg_epk": ("gpu", "avg_epk"), "ultra_thresh": ("gpu", "ultra_thresh"),
               "threads": ("pipeline", "threads"), "mem_frac": ("gpu", "mem_frac")}  # fmt: skip


def plan_config(cfg: Config) -> tuple[Config, Plan]:
    """The daemon's configuration with every tunable setting resolved: keys left at their defaults take
    the learned value (autotune) or the profile's."""
    defaults = Config()
    values = {k: getattr(getattr(cfg, sec), key) for k, (sec, key) in CONFIG_KEYS.items()}
    given = user_set(values, {k: getattr(getattr(defaults, sec), key) for k, (sec, key) in CONFIG_KEYS.items()})
    p = prepare(given, cfg.gpu.profile, dev_id=cfg.gpu.device, disable_cuda=cfg.gpu.disable,
                state_dir=cfg.state_dir() if cfg.gpu.autotune else None)  # fmt: skip
    resolved = {**p.settings.as_dict(), "threads": p.threads, "mem_frac": p.mem_frac}
    for section in ("batch", "gpu", "pipeline"):
        keys = {key: resolved[k] for k, (sec, key) in CONFIG_KEYS.items() if sec == section}
        cfg = replace(cfg, **{section: replace(getattr(cfg, section), **keys)})
    return cfg, p


def prepare(given: Mapping[str, Any], profile: str = "auto", *, dev_id: int = 0, disable_cuda: bool = False,
            state_dir: Path | None = None) -> Plan:  # fmt: skip
    """Probe the GPU, read what was learned on it (when state_dir is given), and plan the start."""
    gpu = None if disable_cuda else probe_gpu(dev_id)
    learned = TuningStore(state_dir).load(gpu) if state_dir is not None and gpu is not None else {}
    p = plan(Machine.this(gpu), profile, given, learned)
    log.info("%s%s", f"{gpu.key}: " if gpu else "", p.describe())
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

        controller = Controller(p.settings, p.bounds, Policy(autotune=autotune, settle_batches=settle_batches))
        store = TuningStore(state_dir) if autotune and state_dir is not None else None
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
            log.info("tuning: %s %s -> %s (%s): stage throughput %s over %d batches", a.knob, a.old, a.new, a.leaf,
                     "unmeasured" if effect is None else f"{effect:+.0%}",
                     change.after.batches if change.after else 0)  # fmt: skip
            self._send(change.as_dict())
        for a in actions:
            log.info("tuning: %s %s -> %s (%s: %s)", a.knob, a.old, a.new, a.leaf, a.why)
            self._send(a.as_dict())
        if actions:
            self._stuck_said.clear()
            self._apply(c.settings)
            if self._store is not None:
                self._store.save(self._gpu, c.settings, len(c.changes))
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
