"""Strings as one ASCII blob: cut from an array in compiled code, or from `str`s, the same strings back."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from streamer_plugins.texts import Texts


def test_slices_are_the_strings_of_their_bounds():
    text = "NACGTTCGAACGGT"
    src = np.frombuffer(text.encode(), np.uint8)
    start, end = np.array([0, 3, 5, 14, 2]), np.array([4, 3, 12, 14, 14])
    got = Texts.slices(src, start, end)
    want = [text[a:b] for a, b in zip(start, end)]
    assert got.tolist() == want and [got[i] for i in range(len(got))] == want and len(got) == 5
    assert got.off.tolist() == [0, 4, 4, 11, 11, 23] and got.blob.tobytes() == "".join(want).encode()
    again = Texts.of(want)
    assert np.array_equal(again.blob, got.blob) and np.array_equal(again.off, got.off)
    # one array type from either source: a kernel given both is compiled once
    assert numba.typeof(again.blob) == numba.typeof(got.blob) and numba.typeof(again.off) == numba.typeof(got.off)


def test_empty_and_not_ascii():
    assert len(Texts.of([])) == 0 and Texts.of([]).tolist() == []
    assert Texts.slices(np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == []
    with pytest.raises(UnicodeEncodeError):
        Texts.of(["ACG", "CGé"])
