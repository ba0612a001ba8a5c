"""The FM-index: its suffix array against a sort of the suffixes themselves (random texts with N runs,
several contigs, repeats, in one piece or many), the BWT, C array and k-mer table against their
definitions, the E. coli reference, and saving beside the reference."""

from __future__ import annotations

import gzip
import logging
import os

import numba
import numpy as np
import pytest

from streamer.align import fmindex as F
from streamer.align.fm_cells import SEP, fm_cells
from streamer.align.suffixes import PIECE_BYTES, bucket_counts, plan_pieces
from streamer.errors import InputError
from streamer.pipeline.targets import CPU

from conftest import REFERENCE

CELLS = fm_cells(CPU)


@numba.njit(cache=True)
def locate_all(bwt, cum, sep_rows, sep_sa, ssa):
    out = np.empty(cum[4], np.int64)
    for r in range(cum[4]):
        out[r] = CELLS.locate(bwt, cum, sep_rows, sep_sa, ssa, r)
    return out


def suffix_array(index: F.FMIndex) -> np.ndarray:
    return locate_all(index.bwt, index.cum, index.sep_rows, index.sep_sa, index.ssa)


def sorted_suffixes(codes: np.ndarray) -> np.ndarray:
    """The suffix array by sorting the suffixes as byte strings (SEP first, a prefix before its extensions)."""
    b = np.array([2, 3, 4, 5, 1], np.uint8)[codes].tobytes()
    return np.array(sorted(range(len(b)), key=lambda i: b[i:]), np.int64)


def random_contigs(rng, n_contigs: int, length: int, repeats: bool) -> list[tuple[str, bytes]]:
    contigs = []
    for c in range(n_contigs):
        seq = rng.choice(np.frombuffer(b"ACGTN", np.uint8), int(rng.integers(1, length)), p=[0.24] * 4 + [0.04])
        if repeats and len(seq) > 400:
            seq[200:400] = seq[0:200]  # an exact copy
            seq[100:160] = ord("A")  # a homopolymer
            seq[300:340] = np.tile(np.frombuffer(b"CAG", np.uint8), 14)[:40]  # a tandem repeat
        contigs.append((f"c{c}", seq.tobytes()))
    return contigs


@pytest.mark.parametrize("seed", range(12))
def test_suffix_array_is_the_sorted_suffixes(seed):
    rng = np.random.default_rng(seed)
    text = F.reference_text(random_contigs(rng, 1 + seed % 3, 2500, repeats=seed % 2 == 1))
    expected = sorted_suffixes(text.codes)
    whole = F.build_index(text, kmer_len=3)
    assert np.array_equal(suffix_array(whole), expected)
    # the BWT's codes are the text before each suffix, and C counts the rows before each code
    codes = text.codes[expected - 1]
    unpacked = (whole.bwt.reshape(-1, 4)[:, 2:].reshape(-1, 1) >> (2 * np.arange(32, dtype=np.uint64))) & np.uint64(3)
    assert np.array_equal(unpacked.ravel()[: whole.n], np.where(codes == SEP, 0, codes))
    assert np.array_equal(whole.sep_rows, np.flatnonzero(codes == SEP))
    assert list(whole.cum) == [int((text.codes < c).sum()) if c else int((text.codes == SEP).sum())
                               for c in (0,)] + [int((text.codes == SEP).sum() + (text.codes < c).sum()) for c in (1, 2, 3, 4)]  # fmt: skip
    # in pieces of at most 50 to 300 suffixes, the same bytes
    piece = int(rng.integers(50, 300))
    assert len(list(plan_pieces(bucket_counts(text.codes, whole.n), piece))) >= whole.n // piece
    assert F.build_index(text, budget=PIECE_BYTES * piece, kmer_len=3).same_as(whole)


def test_kmer_table_is_every_kmers_interval():
    rng = np.random.default_rng(7)
    text = F.reference_text(random_contigs(rng, 2, 3000, repeats=True))
    index = F.build_index(text, kmer_len=4)
    sa = suffix_array(index)
    b = text.codes.tobytes()
    starts = [b[p : p + 4] for p in sa]
    for x in range(256):
        kmer = bytes((x >> (2 * (3 - j))) & 3 for j in range(4))
        rows = [r for r, s in enumerate(starts) if s == kmer]
        lo, hi = int(index.kmer_lo[x]), int(index.kmer_hi[x])
        assert (rows == list(range(lo, hi))) if rows else lo >= hi


def test_text_splits_at_n_runs_and_contig_ends():
    text = F.reference_text([("a", "ACGTNNacgtRA"), ("empty", ""), ("ns", "NNN"), ("b", "GGt")])
    assert text.codes.tobytes() == bytes([0, 1, 2, 3, SEP, 0, 1, 2, 3, SEP, 0, SEP, 2, 2, 3, SEP])
    assert text.seg_text.tolist() == [0, 5, 10, 12]
    assert text.seg_ref.tolist() == [0, 6, 11, 15]  # the contigs laid end to end: a 12, empty 0, ns 3, b 3
    assert text.contig_offsets.tolist() == [0, 12, 12, 15, 18]
    assert text.names == ("a", "empty", "ns", "b")
    with pytest.raises(InputError, match="no A, C, G or T"):
        F.check_text(F.reference_text([("n", "NNNN")]), "ref.fa")


def test_ecoli_reference(tmp_path):
    index = F.load_or_build(_copy(REFERENCE, tmp_path))
    assert index.names == ("NC_000913.3",) and index.contig_offsets.tolist() == [0, 4641652]
    assert index.n == 4641652 + 1 and len(index.sep_rows) == 1
    with gzip.open(REFERENCE, "rt") as fh:
        seq = "".join(line.strip() for line in fh if not line.startswith(">"))
    assert [int(c) for c in np.diff(index.cum)] == [seq.count(b) for b in "ACGT"]
    assert index.nbytes < 4e6  # 0.6 bytes a base and the k-mer table


def _copy(path, folder):
    dst = folder / path.name
    dst.write_bytes(path.read_bytes())
    return dst


def test_saved_beside_the_reference_and_reused(tmp_path, caplog):
    ref = tmp_path / "ref.fa"
    rng = np.random.default_rng(3)
    ref.write_text("".join(f">{name}\n{seq.decode()}\n" for name, seq in random_contigs(rng, 3, 5000, True)))
    built = F.load_or_build(ref)
    path = F.index_path(ref)
    assert path.name == "ref.fa.fmi" and path.is_file()
    mtime = path.stat().st_mtime_ns
    again = F.load_or_build(ref)
    assert again.same_as(built) and path.stat().st_mtime_ns == mtime
    # the same bytes at another time (a fresh clone): reused, the index untouched
    os.utime(ref, ns=(mtime + 10**9, mtime + 10**9))
    assert F.load_or_build(ref).same_as(built) and path.stat().st_mtime_ns == mtime
    assert F.index_stamp(ref)["blake2b"] == F.content_digest(ref)
    # other bytes of the same size: built again
    text = ref.read_text()
    ref.write_text(text[:-2] + ("C" if text[-2] == "A" else "A") + "\n")  # the last base
    assert F.index_stamp(ref) is None
    assert not F.load_or_build(ref).same_as(built) and path.stat().st_mtime_ns != mtime
    # another reference under the same name: built again
    ref.write_text(">x\nACGTACGTTTGACCA\n")
    ref.with_name("ref.fa.fai").unlink()  # htslib's index of the old file
    os.utime(ref, ns=(mtime + 10**9, mtime + 10**9))
    with caplog.at_level(logging.INFO, logger="streamer.align.fmindex"):
        other = F.load_or_build(ref)
    assert other.names == ("x",) and "built from another ref.fa" in caplog.text
    # a damaged index: said, built again
    path.write_bytes(b"not an index")
    caplog.clear()
    assert F.load_or_build(ref).same_as(other)
    assert "cannot read FM-index" in caplog.text


def test_the_engine_reads_the_reference_once(tmp_path, monkeypatch):
    """fm_aligner reads the FASTA once, for the extension and for the index it builds."""
    import streamer.align.genome
    from streamer.align.engine import fm_aligner
    from streamer.io.alignments import AlignmentFilter
    from streamer.io.reference import Reference

    opened = []

    class Counted(Reference):
        def __init__(self, path, *args, **kwargs):
            opened.append(path)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(streamer.align.genome, "Reference", Counted)
    monkeypatch.setattr(F, "Reference", Counted)
    ref = tmp_path / "ref.fa"
    rng = np.random.default_rng(5)
    ref.write_text("".join(f">{name}\n{seq.decode()}\n" for name, seq in random_contigs(rng, 2, 4000, True)))
    aligner = fm_aligner(ref, AlignmentFilter(), target="cpu", threads=1)
    assert F.index_path(ref).is_file() and len(opened) == 1
    assert aligner.names == list(F.load(F.index_path(ref))[0].names)
