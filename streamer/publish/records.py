"""A batch's calls as publisher columns.

Calls name their read by index, so chromosome, read name and strand become
`Categorical` columns whose codes are those indices. The context sequences come as one
blob (`streamer_plugins.texts.Texts`) and become `str`s only here, where the encoder keys
its distinct values by them (hashing the strings costs less than sorting their bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from streamer.publish.protocol import CALL_COLUMNS, Categorical


def call_columns(calls: Any, read_ids: Sequence[str], ref_names: Sequence[str]) -> dict[str, Any]:
    """CALL_COLUMNS of a batch's calls (a `MethCalls`); `read_ids`, `ref_names` are the batch's, per record."""
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
        "sequence": calls.sequence.tolist(),
    }

