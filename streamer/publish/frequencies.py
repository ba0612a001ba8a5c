"""Per-site methylation counts as a subscriber (or a snapshot) sees them.

`meth.freq` updates carry absolute counts for the sites a batch touched, so
applying one twice, or applying it on top of a snapshot that already holds it,
changes nothing: a late joiner converges on exactly the publisher's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from streamer.publish.protocol import FREQ_COLUMNS

SiteKey = tuple[str, int, int]
SiteCounts = tuple[int, int, int, str]  # num_motifs_in_group, called, methylated, group_sequence


class FrequencyTable:
    """Sites keyed by (chromosome, start, end), replaced whole by each update."""

    def __init__(self) -> None:
        self._sites: dict[SiteKey, SiteCounts] = {}

    def __len__(self) -> int:
        return len(self._sites)

    def apply(self, columns: Mapping[str, Any]) -> None:
        """Set the sites in `columns` (FREQ_COLUMNS, absolute counts)."""
        keys = zip(_tolist(columns["chromosome"]), _tolist(columns["start"]), _tolist(columns["end"]))
        counts = zip(
            _tolist(columns["num_motifs_in_group"]),
            _tolist(columns["called_sites"]),
            _tolist(columns["called_sites_methylated"]),
            _tolist(columns["group_sequence"]),
        )
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
    """Sites as FREQ_COLUMNS, sorted by position."""
    items = sorted(sites.items())
    return {
        "chromosome": [k[0] for k, _ in items],
        "start": np.array([k[1] for k, _ in items], dtype=FREQ_COLUMNS["start"]),
        "end": np.array([k[2] for k, _ in items], dtype=FREQ_COLUMNS["end"]),
        "num_motifs_in_group": np.array([c[0] for _, c in items], dtype=FREQ_COLUMNS["num_motifs_in_group"]),
        "called_sites": np.array([c[1] for _, c in items], dtype=FREQ_COLUMNS["called_sites"]),
        "called_sites_methylated": np.array([c[2] for _, c in items], dtype=FREQ_COLUMNS["called_sites_methylated"]),
        "group_sequence": [c[3] for _, c in items],
    }


def _tolist(column: Any) -> list:
    return column.tolist() if isinstance(column, np.ndarray) else list(column)
