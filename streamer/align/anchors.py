"""Seeds: the exact matches between reads and the reference that chaining starts from.

One flat record for a whole batch of reads, so the seeding kernels (CPU or GPU) hand chaining
arrays, never per-read objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Seeds:
    """Exact matches of a batch of reads, sorted by (read, rc, rpos - qpos, qpos).

    `qpos` is on the read as basecalled; where `rc` is set the match is between the read's reverse
    complement (`qpos` counted on it) and the forward reference. `rpos` is a position in the
    reference's contigs laid end to end (`FMIndex.contig_offsets` maps it back to a contig).
    """

    read: np.ndarray  # int32[n]
    qpos: np.ndarray  # int32[n]
    rpos: np.ndarray  # int64[n]
    length: np.ndarray  # int32[n]
    rc: np.ndarray  # bool[n]

    def __len__(self) -> int:
        return len(self.read)
