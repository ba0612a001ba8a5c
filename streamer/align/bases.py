"""Bases as small integer codes (A C G T -> 0 1 2 3, anything else -> 4), the alphabet the
alignment kernels work in; ASCII only at the edges (FASTA/FASTQ in, SAM out)."""

from __future__ import annotations

import numba
import numpy as np

N_CODE = 4
LETTERS = np.frombuffer(b"ACGTN", dtype=np.uint8)

_CODE_OF = np.full(256, N_CODE, dtype=np.uint8)
for _i, _c in enumerate(b"ACGT"):
    _CODE_OF[_c] = _i
    _CODE_OF[ord(chr(_c).lower())] = _i
_CODE_OF.flags.writeable = False


def encode(seq: str | bytes | np.ndarray) -> np.ndarray:
    """uint8 codes of a sequence given as text, bytes or ASCII codes."""
    if isinstance(seq, str):
        seq = seq.encode("ascii", "replace")
    return _CODE_OF[np.frombuffer(seq, dtype=np.uint8) if isinstance(seq, bytes) else seq]


def decode(codes: np.ndarray) -> str:
    """Upper-case text of codes (4 reads as N)."""
    return LETTERS[np.minimum(codes, N_CODE)].tobytes().decode("ascii")


@numba.njit(nogil=True, cache=True)
def revcomp(codes: np.ndarray) -> np.ndarray:
    """The reverse complement of codes (N stays N)."""
    n = len(codes)
    out = np.empty(n, dtype=np.uint8)
    for i in range(n):
        c = codes[n - 1 - i]
        out[i] = 3 - c if c < 4 else c
    return out
