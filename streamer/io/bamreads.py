"""Basecalls from dorado/MinKNOW BAM, unaligned or aligned, beside FASTA/FASTQ.

Only primary records are read: secondary and supplementary records may carry no or a
hard-clipped sequence. An aligned reverse-strand record stores the reverse complement of
the read, so it is turned back into the read as sequenced, which the signal follows. The file
is only read: move tables and MM/ML tags stay as they are.

`open_basecalls` indexes where each read's sequence lies and reads it when asked for, so
a run holds no sequences but those of the batches in hand and needs no list of the reads
it will ask for (the alignments are read once). Gzip files cannot be read at an offset:
their sequences are held in memory.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pysam

from streamer.errors import InputError
from streamer.io.fastx import load_basecalls, tail

BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")

_COMPLEMENT = str.maketrans("ACGTUNacgtun", "TGCAANtgcaan")


def bam_is_complete(path: Path) -> bool:
    """True once a BAM file ends with BGZF's end-of-file block (writers add it when they close)."""
    return tail(path, len(BGZF_EOF)) == BGZF_EOF


def is_bam(path: str | Path) -> bool:
    """True if the file's content is BAM (BGZF holding the BAM magic), whatever its name."""
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read(4) == b"BAM\x01"
    except (OSError, EOFError, zlib.error):
        return False


def _as_sequenced(rec: pysam.AlignedSegment) -> str:
    seq = rec.query_sequence.upper()
    return seq.translate(_COMPLEMENT)[::-1] if rec.is_reverse else seq


def _fastx_spans(path: Path) -> dict[str, tuple[int, int]]:
    """Read id -> (first, end) byte offsets of its sequence lines in a plain FASTA/FASTQ file.

    Reads as `iter_fastx` does: the id is the first word of the name, records without a
    sequence are left out, and of two records with one id the later one counts.
    """
    spans: dict[str, tuple[int, int]] = {}
    name, first, length, qual_left = None, 0, 0, 0
    at = 0
    with open(path, "rb") as fh:
        for line in fh:
            if qual_left > 0:  # FASTQ quality lines, which may start with '@'
                qual_left -= len(line.rstrip(b"\r\n"))
            elif line[:1] in (b">", b"@", b"+") and (name is not None or line[:1] != b"+"):
                if name is not None and length:
                    spans[name] = (first, at)
                if line[:1] == b"+":
                    qual_left, name = length, None
                else:
                    name = (line[1:].split(None, 1) or [b""])[0].decode()
                    first, length = at + len(line), 0
            elif name is not None:
                length += len(line.strip())
            at += len(line)
    if name is not None and length:
        spans[name] = (first, at)
    return spans


class Basecalls(Mapping[str, str]):
    """Basecalls keyed by read id, read from the file when asked for; close when done."""

    def __init__(self, path: Path):
        self.path = path
        self._held: dict[str, str] = {}
        self._spans: dict[str, tuple[int, int]] = {}
        self._offsets: dict[str, int] = {}
        self._fd: int | None = None
        self._bam: pysam.AlignmentFile | None = None
        if is_bam(path):
            self._index_bam()
        elif _is_gzip(path):
            self._held = load_basecalls(path)
        else:
            try:
                self._spans = _fastx_spans(path)
                self._fd = os.open(path, os.O_RDONLY)
            except (OSError, UnicodeDecodeError) as exc:
                raise InputError(path, f"cannot read basecalls: {exc}") from exc

    def _index_bam(self) -> None:
        """Each read's first primary record with a sequence, by virtual offset."""
        try:
            self._bam = pysam.AlignmentFile(str(self.path), "rb", check_sq=False)
        except (OSError, ValueError) as exc:
            raise InputError(self.path, f"cannot open basecalls BAM: {exc}") from exc
        try:
            while True:
                at = self._bam.tell()
                rec = next(self._bam, None)
                if rec is None:
                    break
                if not (rec.is_secondary or rec.is_supplementary or not rec.query_sequence):
                    self._offsets.setdefault(rec.query_name, at)
        except OSError as exc:
            raise InputError(self.path, f"truncated or corrupt BAM: {exc}") from exc

    def __getitem__(self, read_id: str) -> str:
        if self._fd is not None:
            first, end = self._spans[read_id]
            return b"".join(os.pread(self._fd, end - first, first).split()).decode().upper()
        if self._bam is not None:
            self._bam.seek(self._offsets[read_id])
            return _as_sequenced(next(self._bam))
        return self._held[read_id]

    def __contains__(self, read_id: object) -> bool:
        return read_id in (self._spans or self._offsets or self._held)

    def __len__(self) -> int:
        return len(self._spans or self._offsets or self._held)

    def __iter__(self) -> Iterator[str]:
        return iter(self._spans or self._offsets or self._held)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._bam is not None:
            self._bam.close()
            self._bam = None

    def __enter__(self) -> "Basecalls":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def open_basecalls(path: str | Path) -> Basecalls:
    """The basecalls of FASTA/FASTQ or BAM (told from content), indexed for lookup by read id."""
    return Basecalls(Path(path))
