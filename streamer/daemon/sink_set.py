"""The daemon's sinks as one (`streamer.sinks`): opened from the configuration with the ledger and
the publisher, their rows rendered and handed to the journal by file, every other call passed
to each, and their state rebuilt at start-up from the committed rows. No sink is named here
but by the file its rows go to: the eventalign rows' sink also makes the publisher's messages."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from streamer.sinks import Result, Sink, SinkContext, open_sinks, replay

EVENTALIGN_TSV = "eventalign.tsv"
EVENTALIGN = "eventalign"  # the eventalign stage's product


class SinkSet:
    """The sinks the configuration turns on; `rows` those whose rows the journal takes, the calls first."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks
        self.rows = [s for s in sinks if s.journal]
        self.eventalign: Any = next((s for s in self.rows if s.journal == EVENTALIGN_TSV), None)
        self.needs_signal = any(s.needs_signal for s in sinks)
        self.needs_events = any(s.needs_events for s in sinks)

    @classmethod
    def open(cls, config: Any, ledger: Any, publish: Any, beat: Callable[[], None],
             begin: Callable[..., Any]) -> SinkSet:
        """Opened with the daemon's ledger, each attached to the publisher (`streamer.publish.sink.PublishSink`)
        if any; `beat` feeds the watchdog through their long work, `begin` reads their files off the
        engine (`streamer.sinks.SinkContext`)."""
        context = SinkContext("run", out_dir=config.output.dir, ledger=ledger, state_dir=config.state_dir(),
                              publishing=publish is not None, beat=beat, begin=begin)
        opened = cls(open_sinks(config, context))
        if publish is not None:
            opened.each("attach", publish)
            publish.serve_sites()
        return opened

    def __iter__(self) -> Iterator[Sink]:
        return iter(self.sinks)

    def headers(self) -> dict[str, str]:
        """Each journal file's header."""
        return {s.journal: s.header for s in self.rows}

    def count(self, result: Result) -> int:
        """The batch's calls, the count its outcome carries."""
        return self.rows[0].count(result)

    def render(self, result: Any) -> tuple[str, ...]:
        """A result's rows for each row sink (on the driver's compute thread)."""
        if self.eventalign is not None and result.products.get(EVENTALIGN) is None:
            raise TypeError("eventalign is on but the pipeline has no eventalign stage")
        return tuple(s.render(result) for s in self.rows)

    def texts(self, rendered: Sequence[tuple[str, ...]]) -> dict[str, str]:
        """A batch's rows (`render`'s, per result) by journal file."""
        return {s.journal: "".join(r[i] for r in rendered) for i, s in enumerate(self.rows)}

    def eventalign_texts(self, rendered: Sequence[tuple[str, ...]]) -> list[tuple[str, str]]:
        """Per result, ("", its eventalign rows), as `streamer.daemon.batches.eventalign_of` takes them."""
        i = self.rows.index(self.eventalign)
        return [("", r[i]) for r in rendered]

    def each(self, what: str, *args: Any) -> None:
        for sink in self.sinks:
            getattr(sink, what)(*args)

    def load(self, journal_path: Callable[[str], Path], beat: Callable[[], None]) -> None:
        """The sinks' state: the committed rows replayed once, a block at a time, to those that ask for
        them (`beat` between blocks), then what each committed itself."""
        replay(self.sinks, lambda rows: journal_path(rows.journal), beat)
        self.each("restore")

    def close(self) -> None:
        self.each("close")
