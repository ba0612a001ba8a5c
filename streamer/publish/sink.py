"""The publisher as the daemon's sink: each batch's calls, the frequency updates of the sites
they touched and eventalign rows, plus status and run events, as messages.

The publisher is an optional consumer: a call that fails is logged once per kind of message
and never stops the daemon, whose files hold every result anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from streamer.publish.frequencies import COUNTS, SiteCounts, SiteKey
from streamer.publish.protocol import SITE_KEY
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


def freq_update(source: str, rows: Mapping[str, Sequence]) -> dict[str, list]:
    """`meth.freq` columns of one source's rows: the HMM's (f5c meth-freq columns, both strands,
    5mC) or dorado's (modkit bedMethyl columns, as `streamer_plugins.modbase.live.FIELDS`)."""
    n = len(rows["start"])
    site = {"source": [source] * n, "chromosome": list(rows["chromosome"]), "start": list(rows["start"]),
            "end": list(rows["end"])}
    if source == "hmm":
        called, meth = list(rows["called_sites"]), list(rows["called_sites_methylated"])
        zeros = [0] * n
        return site | {"strand": ["."] * n, "mod_code": ["m"] * n,
                       "num_motifs_in_group": list(rows["num_motifs_in_group"]), "called_sites": called,
                       "called_sites_methylated": meth, "group_sequence": list(rows["group_sequence"]),
                       "count_canonical": [c - m for c, m in zip(called, meth)], "count_other_mod": zeros,
                       "count_delete": zeros, "count_fail": zeros, "count_diff": zeros, "count_nocall": zeros}
    return site | {"strand": list(rows["strand"]), "mod_code": list(rows["mod_code"]), "num_motifs_in_group": [1] * n,
                   "called_sites": list(rows["valid_coverage"]), "called_sites_methylated": list(rows["count_modified"]),
                   "group_sequence": [""] * n, **{name: list(rows[name]) for name in COUNTS if name.startswith("count_")}}


def hmm_update(sites: Mapping[tuple[str, int, int], Any]) -> dict[str, list]:
    """`meth.freq` columns of the HMM's sites ((chromosome, start, end) -> `methfreq.SiteStats`)."""
    keys, stats = list(sites), list(sites.values())
    return freq_update("hmm", {
        "chromosome": [k[0] for k in keys], "start": [k[1] for k in keys], "end": [k[2] for k in keys],
        "num_motifs_in_group": [s.group_size for s in stats], "called_sites": [s.called_sites for s in stats],
        "called_sites_methylated": [s.called_sites_methylated for s in stats],
        "group_sequence": [s.sequence for s in stats],
    })  # fmt: skip


def _keyed(columns: Mapping[str, Sequence]) -> dict[SiteKey, SiteCounts]:
    return dict(zip(zip(*(columns[k] for k in SITE_KEY)), zip(*(columns[c] for c in COUNTS))))


class SiteTables:
    """The publisher's snapshot source: the HMM's frequency table and, when the daemon keeps one,
    the modkit table of dorado's calls, as one table of FREQ_COLUMNS sites."""

    def __init__(self, hmm: Any, dorado: Any | None = None):
        self.hmm = hmm
        self.dorado = dorado

    def snapshot(self) -> dict[SiteKey, SiteCounts]:
        out = _keyed(hmm_update(self.hmm.snapshot()))
        dorado = self.dorado.snapshot_columns() if self.dorado is not None else None
        if dorado is not None:
            out |= _keyed(freq_update("dorado", dorado))
        return out


class PublishSink:
    """Messages for `publisher`. The sinks with sites attach to it (`streamer.sinks.SiteChannel`): the
    per-site frequency table, whose sites are published as they change (`changed`, filled by the
    table's sink), as "hmm"; the modkit table, if any, as "dorado"."""

    def __init__(self, publisher: PublisherLike):
        self.publisher = publisher
        self.tables: dict[str, Any] = {}
        self.table: Any = None
        self.changed: set = set()
        self._failed: set[str] = set()

    def serve(self, source: str, table: Any, changed: set | None = None) -> None:
        self.tables[source] = table
        if changed is not None:
            self.table, self.changed = table, changed

    def serve_sites(self) -> None:
        """Snapshots of the attached tables, from the publisher's thread."""
        try:
            self.publisher.serve_sites(SiteTables(self.tables["hmm"], self.tables.get("dorado")))
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
        if n and self.table is not None:
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
        self.send("freq", hmm_update(self.table.select(keys)))
