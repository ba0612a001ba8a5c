"""Basecalls from FASTA/FASTQ files, plain or gzip-compressed."""

from __future__ import annotations

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
