"""Basecalls from dorado/MinKNOW BAM, unaligned or aligned, beside FASTA/FASTQ.

Only primary records are read: secondary and supplementary records may carry no or a
hard-clipped sequence. An aligned reverse-strand record stores the reverse complement of
the read, so it is turned back into the read as sequenced, which the signal follows. The file
is only read: move tables and MM/ML tags stay as they are.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Container, Iterator
from pathlib import Path

import pysam

from streamer.errors import InputError
from streamer.io.fastx import load_basecalls

_COMPLEMENT = str.maketrans("ACGTUNacgtun", "TGCAANtgcaan")


def is_bam(path: str | Path) -> bool:
    """True if the file's content is BAM (BGZF holding the BAM magic), whatever its name."""
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read(4) == b"BAM\x01"
    except (OSError, EOFError, zlib.error):
        return False


def iter_bam_reads(path: str | Path) -> Iterator[tuple[str, str]]:
    """Yield (read_id, sequence as sequenced) for each primary record with a sequence."""
    path = Path(path)
    try:
        fh = pysam.AlignmentFile(str(path), "rb", check_sq=False)
    except (OSError, ValueError) as exc:
        raise InputError(path, f"cannot open basecalls BAM: {exc}") from exc
    with fh:
        try:
            for rec in fh.fetch(until_eof=True):
                seq = rec.query_sequence
                if rec.is_secondary or rec.is_supplementary or not seq:
                    continue
                seq = seq.upper()
                yield rec.query_name, seq.translate(_COMPLEMENT)[::-1] if rec.is_reverse else seq
        except OSError as exc:
            raise InputError(path, f"truncated or corrupt BAM: {exc}") from exc


def load_reads(path: str | Path, wanted: Container[str] | None = None) -> dict[str, str]:
    """Basecalls keyed by read id from FASTA/FASTQ or BAM (told from content); all if `wanted` is None."""
    if not is_bam(path):
        return load_basecalls(path, wanted)
    out: dict[str, str] = {}
    for rid, seq in iter_bam_reads(path):
        if (wanted is None or rid in wanted) and rid not in out:
            out[rid] = seq
    return out
