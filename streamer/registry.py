"""Plugins the core reaches by name: entry points, so that another package can add its own.

Four groups, declared in `pyproject.toml`:

- `streamer.analyses`: stages that run after the core's chain (`streamer.pipeline.stages.Stage`),
  e.g. `cpg` (the CpG methylation caller) and `eventalign`;
- `streamer.sinks`: outputs (`streamer.sinks.Sink`) made from batch results, e.g. `calls`,
  `bedmethyl`, `modbam`;
- `streamer.gpu`: the GPU package (`cuda`: `streamer_gpu`, typed by `streamer.pipeline.gpu.GpuPackage`);
- `streamer.commands`: sub-commands (a module with `NAME`, `HELP`, `add_arguments`, `run`, as in
  `streamer/commands/`), e.g. `pileup`.

An entry point names a class or factory; `load` imports it on first use. The core never
imports the plugin packages itself, so they can be left out, replaced or added to.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from typing import Any

from streamer.errors import StreamerError

ANALYSES = "streamer.analyses"
SINKS = "streamer.sinks"
COMMANDS = "streamer.commands"
GPU = "streamer.gpu"


@cache
def _group(group: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=group)}


def names(group: str) -> list[str]:
    return sorted(_group(group))


def load(group: str, name: str) -> Any:
    """The object the entry point `name` of `group` names; a clear error when none is installed."""
    ep = _group(group).get(name)
    if ep is None:
        have = ", ".join(names(group)) or "none"
        raise StreamerError(f"no {group} plugin named {name!r} is installed (installed: {have}); "
                            "reinstall streamer (pip install .) if its own are missing")
    return ep.load()


def analysis(name: str, *args, **kwargs) -> Any:
    """A new stage from the `streamer.analyses` plugin `name`."""
    return load(ANALYSES, name)(*args, **kwargs)
