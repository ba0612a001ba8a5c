"""Signal files of any supported format, behind one small interface."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from streamer.errors import InputError
from streamer.io import fast5

SIGNAL_SUFFIXES = (".fast5",)


def is_signal_file(path: Path) -> bool:
    return path.suffix.lower() in SIGNAL_SUFFIXES and path.is_file()


def find_signal_files(paths: Iterable[str | Path]) -> list[Path]:
    """Signal files named directly or found (recursively) under the given folders, sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(f for f in p.rglob("*") if is_signal_file(f))
        elif p.is_file():
            found.append(p)
        else:
            raise InputError(p, "no such signal file or folder")
    return sorted(set(found))


def signal_read_ids(path: Path) -> list[str]:
    """Read ids stored in a signal file."""
    return fast5.fast5_read_ids(path)


def read_signal(path: Path, read_id: str) -> fast5.SignalRecord:
    """One read's raw signal and calibration."""
    return fast5.read_fast5(path, read_id)
