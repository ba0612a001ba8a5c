"""Many short ASCII strings as one uint8 blob and int64 offsets: the calls' context sequences.

A batch has tens of thousands of calls and a run millions; a Python `str` for each costs the
thread that makes it, and every consumer (the TSV writer, the frequency tables) wanted the bytes
back in one array anyway. So the strings are cut from the reference in compiled code, without the
GIL (`Texts.slices`), and handed on as they are; a `str` is made only where one is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def _slices(src, start, end):
    n = start.shape[0]
    off = np.empty(n + 1, np.int64)
    off[0] = 0
    for i in range(n):
        off[i + 1] = off[i] + end[i] - start[i]
    blob = np.empty(off[n], np.uint8)
    for i in range(n):
        blob[off[i] : off[i + 1]] = src[start[i] : end[i]]
    return blob, off


@dataclass(frozen=True, eq=False)
class Texts:
    """String i is blob[off[i]:off[i + 1]] (ASCII)."""

    blob: np.ndarray  # uint8
    off: np.ndarray  # int64, n + 1 entries, off[0] == 0

    @classmethod
    def of(cls, strings: Sequence[str]) -> Texts:
        """From `str`s (text read back); UnicodeEncodeError if one is not ASCII. The blob is writable, as
        those of `slices` are: a kernel given both would otherwise be compiled for each (the daemon's first
        batch compiled its frequency tables again after their warm-up: 2.2 s on the GPU box)."""
        off = np.zeros(len(strings) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, strings), np.int64, len(strings)), out=off[1:])
        return cls(np.frombuffer(bytearray("".join(strings).encode("ascii")), np.uint8), off)

    @classmethod
    def slices(cls, src: np.ndarray, start: np.ndarray, end: np.ndarray) -> Texts:
        """src[start[i]:end[i]] for each i (uint8 src, int64 bounds within it)."""
        return cls(*_slices(src, start, end))

    def __len__(self) -> int:
        return self.off.shape[0] - 1

    def __getitem__(self, i: int) -> str:
        return self.blob[self.off[i] : self.off[i + 1]].tobytes().decode("ascii")

    def tolist(self) -> list[str]:
        text = self.blob.tobytes().decode("ascii")
        off = self.off.tolist()
        return [text[a:b] for a, b in zip(off, off[1:])]
