"""Per-site methylation counts as a subscriber (or a snapshot) sees them.

`meth.freq` updates carry absolute counts for the sites a batch touched, so
applying one twice, or applying it on top of a snapshot that already holds it,
changes nothing: a late joiner converges on exactly the publisher's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from streamer.publish.protocol import FREQ_COLUMNS, SITE_KEY

SiteKey = tuple[str, str, int, int, str, str]  # SITE_KEY: source, chromosome, start, end, strand, mod_code
SiteCounts = tuple  # the other FREQ_COLUMNS, in order
COUNTS = tuple(name for name in FREQ_COLUMNS if name not in SITE_KEY)


class FrequencyTable:
    """Sites keyed by SITE_KEY, replaced whole by each update."""

    def __init__(self) -> None:
        self._sites: dict[SiteKey, SiteCounts] = {}

    def __len__(self) -> int:
        return len(self._sites)

    def apply(self, columns: Mapping[str, Any]) -> None:
        """Set the sites in `columns` (FREQ_COLUMNS, absolute counts)."""
        keys = zip(*(_tolist(columns[name]) for name in SITE_KEY))
        counts = zip(*(_tolist(columns[name]) for name in COUNTS))
        self._sites.update(zip(keys, counts))

    def clear(self) -> None:
        self._sites.clear()

    def sites(self) -> dict[SiteKey, SiteCounts]:
        """A copy, for comparing two tables or writing one out."""
        return dict(self._sites)

    snapshot = sites

    def columns(self) -> dict[str, Any]:
        return site_columns(self._sites)


def site_columns(sites: Mapping[SiteKey, SiteCounts]) -> dict[str, Any]:
    """Sites as FREQ_COLUMNS, sorted by key."""
    items = sorted(sites.items())
    out: dict[str, Any] = {}
    for i, name in enumerate(SITE_KEY):
        out[name] = [k[i] for k, _ in items]
    for i, name in enumerate(COUNTS):
        out[name] = [c[i] for _, c in items]
    return {name: out[name] if FREQ_COLUMNS[name] is str else np.array(out[name], dtype=FREQ_COLUMNS[name])
            for name in FREQ_COLUMNS}


def _tolist(column: Any) -> list:
    return column.tolist() if isinstance(column, np.ndarray) else list(column)
