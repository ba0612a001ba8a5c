"""The publisher as the daemon's sink: each batch's calls, the frequency updates of the sites
they touched and eventalign rows, plus status and run events, as messages.

The publisher is an optional consumer: a call that fails is logged once per kind of message
and never stops the daemon, whose files hold every result anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from streamer.publish.records import call_columns

log = logging.getLogger(__name__)


class PublisherLike(Protocol):
    """What the daemon needs of `streamer.publish.Publisher`; any object with these will do."""

    def publish_calls(self, columns: Mapping[str, Any]) -> None: ...

    def publish_freq(self, updates: Mapping[str, Any]) -> None: ...

    def publish_eventalign(self, columns: Mapping[str, Any]) -> None: ...

    def publish_status(self, counters: Mapping[str, Any]) -> None: ...

    def publish_run(self, event: str, info: Mapping[str, Any]) -> None: ...

    def publish_tuning(self, decision: Mapping[str, Any]) -> None: ...

    def serve_sites(self, table: Any) -> None:
        """Serve snapshots from `table` (read from the publisher's thread through `snapshot()`)."""


class PublishSink:
    """Messages for `publisher`; `table` is the per-site frequency table whose sites are published
    as they change (`changed`, filled by the table's sink)."""

    def __init__(self, publisher: PublisherLike, table: Any, changed: set):
        self.publisher = publisher
        self.table = table
        self.changed = changed
        self._failed: set[str] = set()
        try:
            publisher.serve_sites(table)
        except Exception as exc:  # noqa: BLE001 - the publisher is an optional consumer
            log.warning("the publisher cannot serve snapshots of the frequency table (%s)", exc)

    def send(self, what: str, *args: Any) -> None:
        try:
            getattr(self.publisher, f"publish_{what}")(*args)
        except Exception as exc:  # noqa: BLE001 - the publisher is an optional consumer
            if what not in self._failed:
                log.warning("publishing %s failed (%s); results are still written to files", what, exc)
                self._failed.add(what)

    def on_batch(self, results: Iterable[Any], eventalign: Iterable[Mapping[str, Any]] = ()) -> None:
        """The batch's calls, then the current counts of the sites they touched (the table has
        them already, as `serve_sites` requires), then its eventalign message columns."""
        n = 0
        for r in results:
            calls = r.products["calls"]
            n += len(calls)
            if len(calls):
                self.send("calls", call_columns(calls, r.read_ids, r.ref_names))
        if n:
            self.publish_sites()
        for columns in eventalign:
            self.send("eventalign", columns)

    def publish_modcalls(self, columns: Mapping[str, Any]) -> None:
        """The current bedMethyl rows of the sites a counted BAM reached (dorado's calls)."""
        self.send("freq", freq_update("dorado", columns))

    def publish_sites(self) -> None:
        """The current counts of the sites changed since the last time."""
        keys = sorted(self.changed)
        self.changed.clear()
        sites = [self.table.sites[k] for k in keys]
        self.send("freq", {
            "chromosome": [k[0] for k in keys], "start": [k[1] for k in keys], "end": [k[2] for k in keys],
            "num_motifs_in_group": [s.group_size for s in sites], "called_sites": [s.called_sites for s in sites],
            "called_sites_methylated": [s.called_sites_methylated for s in sites],
            "group_sequence": [s.sequence for s in sites],
        })  # fmt: skip
