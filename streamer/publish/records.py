"""The pipeline's records as publisher columns, with no per-call Python work.

Calls name their read by index, so chromosome, read name and strand become
`Categorical` columns whose codes are those indices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from streamer.publish.frequencies import SiteKey
from streamer.publish.protocol import CALL_COLUMNS, FREQ_COLUMNS, Categorical

if TYPE_CHECKING:
    from streamer.plugins.cpg.calls import MethCalls
    from streamer.plugins.methfreq import SiteStats


def call_columns(calls: MethCalls, read_ids: Sequence[str], ref_names: Sequence[str]) -> dict[str, Any]:
    """CALL_COLUMNS of a batch's calls; `read_ids`, `ref_names` are the batch's, per record."""
    return {
        "chromosome": Categorical(ref_names, calls.read),
        "strand": Categorical(("+", "-"), calls.strand < 0),
        "start": calls.start,
        "end": calls.end,
        "read_name": Categorical(read_ids, calls.read),
        "log_lik_ratio": calls.llr,
        "log_lik_methylated": calls.ll_meth,
        "log_lik_unmethylated": calls.ll_unmeth,
        "num_calling_strands": np.ones(len(calls), dtype=CALL_COLUMNS["num_calling_strands"]),  # as f5c prints
        "num_motifs": calls.num_motifs,
        "sequence": calls.sequence,
    }


def freq_columns(sites: Mapping[SiteKey, SiteStats], keys: Iterable[SiteKey]) -> dict[str, Any]:
    """FREQ_COLUMNS (absolute counts) of the `keys` sites of a `MethFreq.sites` table."""
    keys = list(keys)
    stats = [sites[k] for k in keys]
    return {
        "chromosome": [k[0] for k in keys],
        "start": np.array([k[1] for k in keys], dtype=FREQ_COLUMNS["start"]),
        "end": np.array([k[2] for k in keys], dtype=FREQ_COLUMNS["end"]),
        "num_motifs_in_group": np.array([s.group_size for s in stats], dtype=FREQ_COLUMNS["num_motifs_in_group"]),
        "called_sites": np.array([s.called_sites for s in stats], dtype=FREQ_COLUMNS["called_sites"]),
        "called_sites_methylated": np.array([s.called_sites_methylated for s in stats],
                                            dtype=FREQ_COLUMNS["called_sites_methylated"]),
        "group_sequence": [s.sequence for s in stats],
    }
