"""The FM-index of a reference: built on the CPU (here) or the GPU (`streamer_gpu.fmindex`, the same
bytes), saved beside the reference as REF.fmi and reused while the reference is unchanged: keyed by
its size and a digest of its bytes, so a copy or a fresh clone (a new modification time) keeps it.

The text is the reference's contigs laid end to end over A, C, G and T, split into segments at every
other base (N and the other IUPAC codes, which are in no seed) and at contig ends, each segment
followed by a separator, so no match crosses one. One strand is indexed: seeding searches each read
and its reverse complement (`streamer.align.seeds`), which halves the index's memory (what a Jetson
and a human genome need) for twice the backward search, which the GPU has plenty of.

Sizes, per base of the text: the BWT at 2 bits with an occurrence checkpoint (4 uint32 counts) every
64 rows, the two interleaved in 32-byte blocks so that one rank reads one block (4 bits a base in
all); the suffix array sampled every 32 rows, uint32 (1 bit a base; a locate walks 32 LF steps on
average); a table of the suffix array intervals of every k-mer, k = log4(n) - 3 up to 12, which
starts each backward search k symbols in (n/64 k-mers of 8 bytes: 1/8 byte a base). E. coli: 3.4 MB;
a human genome: about 2.1 GB. Texts of 2^32 symbols or more are refused (uint32 rows).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

import numba
import numpy as np

from streamer.align.bases import encode
from streamer.align.fm_cells import BLOCK_ROWS, KEY_SYMBOLS, SA_SAMPLE, SEP, fm_cells
from streamer.align.suffixes import PIECE_BYTES, sort_suffixes
from streamer.errors import InputError
from streamer.io.reference import Reference
from streamer.pipeline.targets import CPU

log = logging.getLogger(__name__)

FORMAT = 1
SUFFIX = ".fmi"
BUILD_BYTES = 2 << 30  # memory for a piece of the suffix sort unless told: E. coli to a 60 Mb genome in one piece
MAX_KMER = 12
MAX_TEXT = (1 << 32) - 1
DIGEST_CHUNK = 1 << 20
LAYOUT = {"format": FORMAT, "block_rows": BLOCK_ROWS, "sa_sample": SA_SAMPLE, "key_symbols": KEY_SYMBOLS}

_cells = fm_cells(CPU)
_pack_block, _kmer_step = _cells.pack_block, _cells.kmer_step


class Text(NamedTuple):
    """The reference as the index sees it: its segments, each followed by a SEP."""

    codes: np.ndarray  # uint8[n]
    seg_text: np.ndarray  # int64[n_seg]: where each segment starts in the text
    seg_ref: np.ndarray  # int64[n_seg]: and in the contigs laid end to end
    names: tuple[str, ...]
    contig_offsets: np.ndarray  # int64[n_contigs + 1]


@dataclass(frozen=True, eq=False)
class FMIndex:
    """The arrays of one reference's index (`streamer.align.fm_cells` describes their layout); equal to
    itself only (`same_as` compares the arrays), so the GPU keeps its copy per index."""

    names: tuple[str, ...]
    contig_offsets: np.ndarray  # int64[n_contigs + 1]: contig i is [off[i], off[i+1]) of the contigs end to end
    seg_text: np.ndarray  # int64[n_seg]
    seg_ref: np.ndarray  # int64[n_seg]
    cum: np.ndarray  # int64[5]: rows starting with a code below c (the C array); cum[4] = n
    bwt: np.ndarray  # uint64[4 * n_blocks]: checkpoints and packed codes
    sep_rows: np.ndarray  # int64[n_seg]: the rows whose BWT is a SEP, ascending
    sep_sa: np.ndarray  # int64[n_seg]: their suffix array entries (segment starts)
    ssa: np.ndarray  # uint32[ceil(n / SA_SAMPLE)]
    kmer_lo: np.ndarray  # uint32[4^k]: the interval of each k-mer (lo >= hi: absent)
    kmer_hi: np.ndarray

    @property
    def n(self) -> int:
        """Symbols in the text (bases and separators)."""
        return int(self.cum[4])

    @property
    def kmer_len(self) -> int:
        return int(round(math.log(len(self.kmer_lo), 4)))

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f.name).nbytes for f in fields(self) if f.name != "names")

    def contig_of(self, rpos: np.ndarray) -> np.ndarray:
        """The contig of each position in the contigs laid end to end."""
        return np.searchsorted(self.contig_offsets, rpos, side="right") - 1

    def same_as(self, other: FMIndex) -> bool:
        """Every array equal, byte for byte (CPU and GPU builds)."""
        return self.names == other.names and all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self) if f.name != "names")


def _segment(bases: np.ndarray, contig_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The text of concatenated contig codes: each maximal run of codes 0-3 inside a contig, then a SEP;
    and where each run starts in the text and in the contigs."""
    base = bases < SEP
    first, last = base.copy(), base.copy()  # a run's first and last base: a contig's ends break runs too
    first[1:] &= ~base[:-1]
    last[:-1] &= ~base[1:]
    starts, ends = contig_offsets[:-1], contig_offsets[1:] - 1
    starts, ends = starts[starts < len(bases)], ends[ends >= 0]
    first[starts], last[ends] = base[starts], base[ends]
    seg_ref = np.flatnonzero(first).astype(np.int64)
    seg_end = np.flatnonzero(last).astype(np.int64) + 1
    seg_text = np.zeros(len(seg_ref), np.int64)
    np.cumsum(seg_end[:-1] - seg_ref[:-1] + 1, out=seg_text[1:])
    text = np.full(int(np.sum(seg_end - seg_ref)) + len(seg_ref), SEP, np.uint8)
    _copy_runs(bases, seg_ref, seg_end, seg_text, text)
    return text, seg_text, seg_ref


@numba.njit(nogil=True, cache=True)
def _copy_runs(bases, seg_ref, seg_end, seg_text, text):
    for s in range(len(seg_ref)):
        text[seg_text[s]:seg_text[s] + seg_end[s] - seg_ref[s]] = bases[seg_ref[s]:seg_end[s]]


def reference_text(contigs: Iterable[tuple[str, bytes | str | np.ndarray]]) -> Text:
    """The index's text of (name, bases) contigs."""
    return codes_text((name, encode(seq)) for name, seq in contigs)


def codes_text(contigs: Iterable[tuple[str, np.ndarray]]) -> Text:
    """The index's text of (name, base codes) contigs, as `bases.encode` and `genome.read_fasta` give them."""
    names, parts = [], []
    for name, codes in contigs:
        names.append(name)
        parts.append(codes)
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    text, seg_text, seg_ref = _segment(np.concatenate(parts) if parts else np.zeros(0, np.uint8), offsets)
    return Text(text, seg_text, seg_ref, tuple(names), offsets)


def fasta_text(path: str | Path) -> Text:
    """The index's text of a FASTA file (plain, gzip or bgzip)."""
    with Reference(path) as ref:
        text = reference_text((name, ref.fetch(name, 0, ref.length(name))) for name in ref.names)
    return text


def kmer_len_for(n: int) -> int:
    """The k of the k-mer table: about n / 64 k-mers (1/8 byte a base), 1 to 12."""
    return max(1, min(MAX_KMER, int(math.log(max(n, 1), 4)) - 3))


@numba.njit(nogil=True, cache=True)
def pack_blocks(codes, bwt):
    """Pack every block of 64 codes into bwt; returns each block's counts of codes 0-3 (SEP as 0)."""
    n_blocks = len(bwt) // 4
    counts = np.empty((n_blocks, 4), np.int64)
    for b in range(n_blocks):
        a, c, g, t = _pack_block(codes, len(codes), b, bwt)
        counts[b, 0] = a
        counts[b, 1] = c
        counts[b, 2] = g
        counts[b, 3] = t
    return counts


def checkpoint(bwt: np.ndarray, block_counts: np.ndarray, n_seg: int) -> np.ndarray:
    """Write each block's counts of codes 0-3 before it into bwt; returns the C array (cum)."""
    before = np.zeros_like(block_counts)
    np.cumsum(block_counts[:-1], axis=0, out=before[1:])
    before = before.astype(np.uint64)
    bwt[0::4] = before[:, 0] | (before[:, 1] << np.uint64(32))
    bwt[1::4] = before[:, 2] | (before[:, 3] << np.uint64(32))
    totals = block_counts.sum(axis=0)
    totals[0] -= n_seg  # SEPs are stored as A
    cum = np.zeros(5, np.int64)
    cum[0] = n_seg
    cum[1:] = n_seg + np.cumsum(totals)
    return cum


@numba.njit(nogil=True, cache=True)
def kmer_tables(bwt, cum, sep_rows, k):
    """The suffix array interval of every k-mer (k-mer x: its codes in base 4, the first highest)."""
    lo = np.zeros(1, np.uint32)
    hi = np.full(1, cum[4], np.uint32)
    for level in range(k):
        nlo = np.empty(4 ** (level + 1), np.uint32)
        nhi = np.empty(4 ** (level + 1), np.uint32)
        for x in range(len(nlo)):
            _kmer_step(bwt, cum, sep_rows, lo, hi, nlo, nhi, level, x)
        lo, hi = nlo, nhi
    return lo, hi


def empty_parts(text: Text) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the suffix sort fills: BWT codes (uint8[n]), sampled entries, each segment's SEP row."""
    n = len(text.codes)
    return np.empty(n, np.uint8), np.zeros((n + SA_SAMPLE - 1) // SA_SAMPLE, np.uint32), np.empty(len(text.seg_text), np.int64)


def sep_order(text: Text, seg_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sep_rows, sep_sa): the SEP rows ascending, and the segment start each one's suffix is."""
    order = np.argsort(seg_row, kind="stable")
    return seg_row[order], text.seg_text[order]


def max_piece_for(budget: int) -> int:
    """Suffixes in one piece of the sort within `budget` bytes."""
    return max(1, budget // PIECE_BYTES)


def check_text(text: Text, source: str | Path) -> None:
    if not len(text.seg_text):
        raise InputError(source, "reference has no A, C, G or T to index")
    if len(text.codes) > MAX_TEXT:
        raise InputError(source, f"reference too large to index ({len(text.codes)} symbols, at most {MAX_TEXT})")


def build_index(text: Text, *, budget: int = BUILD_BYTES, kmer_len: int | None = None) -> FMIndex:
    """The index of `text`, on the CPU, its suffixes sorted in pieces of at most `budget` bytes."""
    check_text(text, "reference")
    codes, ssa, seg_row = empty_parts(text)
    sort_suffixes(text.codes, text.seg_text, max_piece_for(budget), codes, ssa, seg_row)
    bwt = np.zeros(4 * (len(codes) // BLOCK_ROWS + 1), np.uint64)
    cum = checkpoint(bwt, pack_blocks(codes, bwt), len(text.seg_text))
    sep_rows, sep_sa = sep_order(text, seg_row)
    k = kmer_len_for(len(codes)) if kmer_len is None else kmer_len
    kmer_lo, kmer_hi = kmer_tables(bwt, cum, sep_rows, k)
    return FMIndex(text.names, text.contig_offsets, text.seg_text, text.seg_ref, cum, bwt, sep_rows, sep_sa, ssa,
                   kmer_lo, kmer_hi)  # fmt: skip


def index_path(reference: str | Path) -> Path:
    """Where the index of a reference is kept: beside it, REF.fmi."""
    reference = Path(reference)
    return reference.with_name(reference.name + SUFFIX)


def content_digest(path: str | Path) -> str:
    """blake2b of a file's bytes, read 1 MB at a time."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while chunk := fh.read(DIGEST_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stamp(reference: Path) -> dict:
    """What an index is kept with: this layout, and the reference's size, digest and modification time
    (the time only a fast path: `_built_from`)."""
    st = reference.stat()
    return {**LAYOUT, "size": st.st_size, "blake2b": content_digest(reference), "mtime_ns": st.st_mtime_ns}


def _built_from(saved: dict, reference: Path) -> bool:
    """Whether an index saved with `saved` is this reference's: this layout and size, then the same
    modification time (trusted, nothing read) or else the same digest."""
    st = reference.stat()
    if any(saved.get(k) != v for k, v in LAYOUT.items()) or saved.get("size") != st.st_size:
        return False
    return saved.get("mtime_ns") == st.st_mtime_ns or saved.get("blake2b") == content_digest(reference)


def index_stamp(reference: str | Path) -> dict | None:
    """The stamp REF.fmi was saved with where it is this reference's index (its arrays not read), less
    the modification time: what the index's content depends on. None where there is none or it is stale."""
    reference = Path(reference)
    try:
        with np.load(index_path(reference)) as z:
            saved = json.loads(z["meta"].tobytes())["stamp"]
        if not _built_from(saved, reference):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {k: v for k, v in saved.items() if k != "mtime_ns"}


def save(index: FMIndex, path: str | Path, stamp: dict | None = None) -> None:
    """Write the index to path (npz, uncompressed), whole or not at all."""
    path = Path(path)
    arrays = {f.name: getattr(index, f.name) for f in fields(index) if f.name != "names"}
    meta = json.dumps({"names": list(index.names), "stamp": stamp or {"format": FORMAT}})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, meta=np.frombuffer(meta.encode(), np.uint8), **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: str | Path) -> tuple[FMIndex, dict]:
    """An index written by `save`, and the stamp it was saved with."""
    try:
        with np.load(path) as z:
            meta = json.loads(z["meta"].tobytes())
            arrays = {f.name: z[f.name] for f in fields(FMIndex) if f.name != "names"}
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(path, f"cannot read FM-index ({exc})") from exc
    if meta["stamp"].get("format") != FORMAT:
        raise InputError(path, f"FM-index format {meta['stamp'].get('format')}, this version reads {FORMAT}")
    return FMIndex(names=tuple(meta["names"]), **arrays), meta["stamp"]


def load_or_build(reference: str | Path, *, budget: int = BUILD_BYTES, target: str = "cpu",
                  contigs: list[tuple[str, np.ndarray]] | None = None) -> FMIndex:
    """The index of a FASTA file: REF.fmi when it was built from this very file, else built (on the
    GPU for target "gpu"), saved there (when the folder is writable) and returned. `contigs`: the file
    already read as codes (`genome.read_fasta`), which a build then takes rather than reading it again."""
    reference = Path(reference)
    path = index_path(reference)
    if path.is_file():
        try:
            index, saved = load(path)
            if _built_from(saved, reference):
                return index
            log.info("%s was built from another %s: building it again", path, reference.name)
        except InputError as exc:
            log.warning("%s: building it again", exc)
    t0 = time.perf_counter()
    text = codes_text(contigs) if contigs is not None else fasta_text(reference)
    check_text(text, reference)
    index = None
    if target == "gpu":
        from streamer.pipeline.gpu import gpu_package

        index = gpu_package().build_fmindex(text, budget)
        target = "gpu" if index is not None else "cpu"
    if index is None:
        index = build_index(text, budget=budget)
    log.info("FM-index of %s: %d bases in %d segments, %.1f MB, built on the %s in %.1f s", reference,
             int(text.contig_offsets[-1]), len(text.seg_text), index.nbytes / 1e6, target.upper(),
             time.perf_counter() - t0)  # fmt: skip
    try:
        save(index, path, _stamp(reference))
    except OSError as exc:
        log.warning("could not save the FM-index beside %s (%s): it is built again next time", reference, exc)
    return index
