"""Basecalls from FASTA/FASTQ files, plain or gzip-compressed."""

from __future__ import annotations

import os
import zlib
from collections.abc import Container, Iterator
from pathlib import Path

import pysam

from streamer.errors import InputError


def iter_fastx(path: str | Path) -> Iterator[tuple[str, str]]:
    """Yield (read_id, sequence) from a FASTA or FASTQ file; the read id is the first word of the name."""
    path = Path(path)
    try:
        with pysam.FastxFile(str(path)) as fh:
            for rec in fh:
                if not rec.sequence:
                    continue
                yield rec.name, rec.sequence.upper()
    except (OSError, ValueError) as exc:
        raise InputError(path, f"cannot read basecalls: {exc}") from exc


def load_basecalls(path: str | Path, wanted: Container[str] | None = None) -> dict[str, str]:
    """Sequences of the wanted reads (all reads if `wanted` is None), keyed by read id."""
    return {rid: seq for rid, seq in iter_fastx(path) if wanted is None or rid in wanted}


def tail(path: Path, n: int) -> bytes:
    """The last `n` bytes of a file (fewer if it is shorter)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - n))
        return fh.read()


def text_completeness(path: Path) -> tuple[str, str]:
    """("complete" | "incomplete" | "corrupt", why not) of a FASTQ/FASTA file a writer may still be
    writing: gzip must decompress to the trailer of its last member, plain text end with a newline."""
    if Path(path).name.lower().endswith(".gz"):
        return _gzip_completeness(path)
    if tail(path, 1) == b"\n":
        return "complete", ""
    return "incomplete", "last line is not terminated"


def _gzip_completeness(path: Path) -> tuple[str, str]:
    """Decompress (and discard) every member; complete only if the last one ended with its trailer."""
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            return "corrupt", "not gzip-compressed (bad magic bytes)"
        fh.seek(0)
        d = zlib.decompressobj(wbits=31)
        in_member = False
        try:
            while chunk := fh.read(1 << 20):
                while chunk:
                    d.decompress(chunk)
                    in_member = True
                    if not d.eof:
                        break
                    chunk, in_member = d.unused_data, False
                    d = zlib.decompressobj(wbits=31)
        except zlib.error as exc:
            return "corrupt", f"corrupt gzip data ({exc})"
    if in_member:
        return "incomplete", "gzip stream has no trailer (truncated, or still being written)"
    return "complete", ""
