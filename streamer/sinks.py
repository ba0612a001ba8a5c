"""Outputs made from batch results, behind one small interface, found by name in the registry.

A sink is made by its `streamer.sinks` entry point with keyword settings (`open_sink`) and
then sees every batch result in batch order. A sink with rows (the calls TSV, eventalign)
renders them as text and leaves the writing to its host: `streamer call` writes them to its
output file, the daemon appends them to its journal and commits them with the ledger, so
that they are written exactly once. A sink that derives a table (meth-freq, bedMethyl,
modBAM) takes the batch's structured results in `on_batch` and writes the table on
`refresh` (replaced whole) and `close`. No sink reads back text the program wrote, except
the daemon's journal replay at start-up (`CallRows.replay`), which rebuilds the tables from
the rows committed before a restart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from streamer import registry


class Result(Protocol):
    """What a sink sees of a batch (`streamer.pipeline.stages.BatchResult`, or a block of replayed rows)."""

    read_ids: Sequence[str]
    ref_names: Sequence[str]
    products: Mapping[str, Any]  # each analysis's output, by its name ("calls", "eventalign")


class Sink(Protocol):
    header: str  # the first line of its rows ("" when it has none)

    def render(self, result: Result) -> str:
        """The batch's rows as text ("" when it has none); may run off the writing thread."""
        ...

    def on_batch(self, result: Result) -> None:
        """The batch's structured results, in batch order, once its rows are written."""
        ...

    def refresh(self) -> None:
        """Rewrite what it derives, whole."""
        ...

    def close(self) -> None: ...


class BaseSink:
    """A sink that does nothing; sinks override what they need."""

    header = ""

    def render(self, result: Result) -> str:
        return ""

    def on_batch(self, result: Result) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self.refresh()


def open_sink(name: str, **settings: Any) -> Any:
    """The sink the `streamer.sinks` plugin `name` makes with `settings`."""
    return registry.load(registry.SINKS, name)(**settings)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` whole, so readers never see half a table."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")  # one name: what a killed writer left is reused
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written table behind
        raise
