"""Outputs made from batch results, behind one contract, found by name in the registry.

Every host opens its sinks the same way, `open_sinks(config, context)`: the daemon, `streamer
call` (its flags as configuration keys and `SinkContext.files`), its Dask workers, `streamer
eventalign` and `streamer meth-freq`. It asks each `streamer.sinks` entry point of the standard
outputs, then those `output.sinks` lists, for its sink: the class's `open` reads its own keys
of the configuration and the context, and returns None when it is off there. A new output is
a new module and its entry point, named in `output.sinks` (`streamer call --sink NAME`).

A sink with rows (`header`: the calls TSV, eventalign) renders them as text and leaves the
writing to its host: `streamer call` writes them to its output file, the daemon appends them
to its journal (`journal` is the file's name there) and commits them with the ledger, so that
they are written exactly once. A sink that derives something (meth-freq, bedMethyl, modBAM,
the modkit table, a plugin's own file) takes each batch's structured results in `on_batch`, a
registered input file in `on_file`, and writes on `refresh` (replaced whole) and `close`. In
the daemon it is rebuilt at start-up by `restore`, from the committed rows replayed through
`on_batch` when it asks for them (`replays`; `replay` reads them back through their row
sink's `read_back`, as `streamer meth-freq` reads its input), and from what it committed
itself through its `SinkLedger`. Nothing committed is read back mid-run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from streamer import registry

STANDARD = ("calls", "methfreq", "bedmethyl", "modbam", "modbam-copies", "modkit", "eventalign", "eventalign-sam",
            "eventalign-summary")  # each decides from the configuration and the context whether it is on


class Result(Protocol):
    """What a sink sees of a batch (`streamer.pipeline.stages.BatchResult`, or a block of replayed rows)."""

    read_ids: Sequence[str]
    ref_names: Sequence[str]
    products: Mapping[str, Any]  # each analysis's output, by its name ("calls", "eventalign")


class SinkLedger(Protocol):
    """What a daemon sink may ask of the daemon's ledger (`streamer.daemon.ledger.Ledger`)."""

    def meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def modcall_files(self) -> list[tuple[int, Path, int, int]]: ...

    def uncounted_bams(self) -> list[tuple[int, Path, int, int, bool]]: ...

    def record_modcalls(self, file_id: int, size: int, mtime_ns: int, n_reads: int, n_calls: int) -> None: ...

    def forget_modcalls(self, file_ids: Iterable[int]) -> None: ...

    def modcall_counts(self) -> dict[str, int]: ...

    def finished_bams(self) -> list[tuple[int, Path]]: ...

    def reads_of_file(self, file_id: int) -> set[str]: ...

    def reads_awaiting_modbam(self) -> set[str]: ...

    def record_modbam(self, file_id: int, output: Path | None, reason: str | None = None) -> None: ...

    def modbam_counts(self) -> dict[str, int]: ...


class SiteChannel(Protocol):
    """The publisher as a sink reaches it (`streamer.publish.sink.PublishSink`)."""

    def serve(self, source: str, table: Any, changed: set | None = None) -> None:
        """Snapshots of `source`'s sites from `table`; `changed` collects the sites to publish after a batch."""

    def publish_modcalls(self, columns: Mapping[str, Any]) -> None: ...


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class SinkContext:
    """Where sinks are opened, beside the configuration.

    `files`: the file each output option of a one-shot command names (`call --bedmethyl FILE`);
    `options`: how it asks them written (`eventalign --sam-out-version 2`);
    `out_dir`: the folder of a sink's own files (the daemon's output folder, the folder of
    `call -o`); `ledger` and `state_dir`: the daemon's, None elsewhere; `beat`: feeds the
    daemon's watchdog through long work; `begin(fn, *args)`: the daemon's, `fn(*args)` (a module-level
    function, picklable arguments) begun in its parsing process, off the GIL its engine shares with the
    stages, and handed back as a `streamer.pipeline.parsing.Parsed` (`done()`, `result()`).
    """

    command: str  # "call", "eventalign", "meth-freq", "run"; "warm-up": what row sinks compile with
    out_dir: Path | None = None
    files: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)  # a one-shot command's other output flags, by name
    ledger: SinkLedger | None = None
    state_dir: Path | None = None
    publishing: bool = False
    beat: Callable[[], None] = _nothing
    begin: Callable[..., Any] | None = None

    @property
    def daemon(self) -> bool:
        return self.ledger is not None


class Sink(Protocol):
    header: str  # the first line of its rows ("" when it has none)
    journal: str  # the file its rows go to in the daemon's journal ("" when it has none)
    replays: bool  # the daemon replays the committed calls through `on_batch` at start-up
    needs_signal: bool  # it renders from a batch's signal, which is otherwise let go once the events are in
    needs_events: bool  # it renders from the events' starts, lengths and spreads, otherwise not made

    def render(self, result: Result) -> str:
        """The batch's rows as text ("" when it has none); may run off the writing thread."""
        ...

    def count(self, result: Result) -> int:
        """The batch's rows (0 when it has none)."""
        ...

    def restore(self) -> None:
        """What it committed itself, after the replay (the daemon, at start-up)."""
        ...

    def on_batch(self, result: Result) -> None:
        """The batch's structured results, in batch order, once its rows are written (and committed)."""
        ...

    def on_file(self, kind: str, fmt: str) -> None:
        """An input file of `kind` ("signal", "basecalls") and `fmt` was registered in the ledger."""
        ...

    def attach(self, channel: SiteChannel) -> None:
        """The publisher, when there is one."""
        ...

    def refresh(self, final: bool = False) -> None:
        """Rewrite what it derives, whole (`final`: at exit, changed or not)."""
        ...

    def summary(self) -> Mapping[str, Any]:
        """Its part of summary.json (top-level keys)."""
        ...

    def on_reopened(self, file_ids: tuple[int, ...]) -> None:
        """Basecall BAMs (ledger ids) whose late reads a signal file brought: their reads are not all done again."""
        ...

    def read_back(self, path: Path, beat: Callable[[], None] = ...) -> Iterable[Result]:
        """Rows of its kind in `path` as results, a block at a time (`beat` between blocks)."""
        ...

    def close(self) -> None:
        """Release what it holds (what it derives was written by the last `refresh`)."""
        ...


class BaseSink:
    """A sink that does nothing; sinks override what they need."""

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> Sink | None:
        """The sink `config` turns on in `context`, or None (the daemon's, unless a sink says otherwise)."""
        return None

    header = ""
    journal = ""
    replays = False
    needs_signal = False
    needs_events = False

    def render(self, result: Result) -> str:
        return ""

    def count(self, result: Result) -> int:
        return 0

    def restore(self) -> None:
        pass

    def on_batch(self, result: Result) -> None:
        pass

    def on_file(self, kind: str, fmt: str) -> None:
        pass

    def attach(self, channel: SiteChannel) -> None:
        pass

    def refresh(self, final: bool = False) -> None:
        pass

    def summary(self) -> Mapping[str, Any]:
        return {}

    def on_reopened(self, file_ids: tuple[int, ...]) -> None:
        pass

    def read_back(self, path: Path, beat: Callable[[], None] = _nothing) -> Iterable[Result]:
        return ()

    def close(self) -> None:
        pass


def open_sinks(config: Any, context: SinkContext) -> list[Sink]:
    """The sinks the configuration turns on here: the standard ones, then those `output.sinks` names."""
    names = dict.fromkeys([*STANDARD, *config.output.sinks])
    sinks = []
    try:
        for name in names:
            sink = registry.load(registry.SINKS, name).open(config, context)
            if sink is not None:
                sinks.append(sink)
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks


def row_sinks(sinks: Sequence[Sink]) -> list[Sink]:
    """The sinks with rows, in the order opened (the calls first when they are on)."""
    return [s for s in sinks if s.header]


def replay(sinks: Sequence[Sink], path_of: Callable[[Sink], Path], beat: Callable[[], None] = _nothing) -> None:
    """Rows written before (each row sink's in `path_of(sink)`), read back a block at a time, through
    `on_batch` of the sinks that replay them: the daemon's start-up, `streamer meth-freq`."""
    replaying = [s for s in sinks if s.replays]
    if not replaying:
        return
    for rows in row_sinks(sinks):
        for block in rows.read_back(path_of(rows), beat):
            for sink in replaying:
                sink.on_batch(block)


def warm_up(config: Any, result: Result) -> None:
    """The row sinks' formatting compiled on the pipeline's synthetic result, before the first batch."""
    for sink in open_sinks(config, SinkContext("warm-up")):
        try:
            sink.render(result)
        finally:
            sink.close()


def write_atomic(path: Path, text: str | Iterable[Any]) -> None:
    """Replace `path` whole, so readers never see half a table: `text`, or its UTF-8 bytes a block at a time
    (each block bytes-like: bytes, a uint8 array)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")  # one name: what a killed writer left is reused
    try:
        with open(tmp, "wb") as fh:
            for block in [text.encode()] if isinstance(text, str) else text:
                fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written table behind
        raise
