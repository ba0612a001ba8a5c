"""What every command checks before it starts work: numeric flags in range, input files of the
right kind, output files that can be written and are removed again when the run fails.

Numeric flags take their type and minimum from the daemon's configuration schema
(`streamer.config`) where the daemon has the same setting, so `streamer call -K 0` and
`batch.max_reads: 0` are refused by one rule; flags with no config key name their own minimum.
A bad value stops the command with one line (`UsageError`, exit 2) before any work is done.
"""

from __future__ import annotations

import argparse
import gzip
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from streamer import config
from streamer.errors import InputError, interrupted
from streamer.flags import bounded


@cache
def _schema() -> dict[str, config.Key]:
    return {k.path: k for k in config.schema()}


def numeric(p: argparse.ArgumentParser | Any, *names: str, key: str | None = None, type: type | None = None,
            minimum: float | None = None, **kwargs: Any) -> argparse.Action:
    """A numeric flag whose type and minimum come from config key `key` (or are given here)."""
    if key is not None:
        k = _schema()[key]
        type = type or k.type
        minimum = k.minimum if minimum is None else minimum
    return bounded(p, *names, type=type, minimum=minimum, key=key, **kwargs)


# ---------------------------------------------------------------------------- input files

BAM_MAGIC = b"BAM\x01"


def check_bam(path: Path, flag: str = "-b/--bam") -> None:
    """`path` is a BAM file; a FASTA/FASTQ or SAM given in its place is named as what it is."""
    _check_file(path, flag)
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
        with (gzip.open(path, "rb") if head == b"\x1f\x8b" else open(path, "rb")) as fh:
            start = fh.read(4)
    except (OSError, EOFError) as exc:
        raise InputError(path, f"not a BAM file ({flag}): {exc}") from None
    if start == BAM_MAGIC:
        return
    what = {b">": "it is FASTA", b"@": "it is FASTQ or SAM text"}.get(start[:1], "unknown content")
    raise InputError(path, f"not a BAM file ({flag}; {what}): give the reads' alignments to the reference as "
                           "BAM, e.g. `minimap2 -ax map-ont REF READS | samtools sort -o reads.bam`")


def _check_file(path: Path, flag: str) -> None:
    if path.is_dir():
        raise InputError(path, f"a folder, not a file ({flag})")
    if not path.exists():
        raise InputError(path, f"no such file ({flag})")
    if not os.access(path, os.R_OK):
        raise InputError(path, f"file is not readable ({flag})")


def check_files(**files: Path | None) -> None:
    """Each named input file exists and is readable: `check_files(**{"-g/--genome": path})`."""
    for flag, path in files.items():
        if path is not None:
            _check_file(Path(path), flag)


# ---------------------------------------------------------------------------- output files


def check_writable(**outputs: Path | None) -> None:
    """Each output path can be created: its folder exists and can be written; it is not a folder."""
    for flag, path in outputs.items():
        if path is None or str(path) == "-":
            continue
        path = Path(path)
        folder = path.parent
        if path.is_dir():
            raise InputError(path, f"a folder: {flag} takes a file name")
        if not folder.is_dir():
            raise InputError(path, f"cannot write {flag}: no folder {folder} (make it first)")
        if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise InputError(path, f"cannot write {flag}: permission denied")


@contextmanager
def removed_on_failure(*paths: Path | None) -> Iterator[None]:
    """A run that fails removes the outputs it created, so none is mistaken for a finished one; an
    interrupted run (Ctrl-C) keeps them, with the journal `--resume` starts from."""
    existed = {Path(p) for p in paths if p is not None and str(p) != "-" and Path(p).exists()}
    try:
        yield
    except BaseException as exc:
        if interrupted(exc):
            raise
        for p in paths:
            if p is not None and str(p) != "-" and Path(p) not in existed:
                Path(p).unlink(missing_ok=True)
        raise

