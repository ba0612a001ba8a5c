"""Signal files of any supported format (FAST5, POD5, SLOW5/BLOW5) behind one small interface.

The format is told from the file's first bytes, so a file with a wrong or missing
extension is still read by the right reader; the extension decides only when the content
is unrecognised (an empty file, or one cut short before its signature), so that the
format's own reader can say what is wrong. Folder walks pick files by extension, which
keeps logs, indexes and partial `.tmp` files out. Each format's library is imported by its
reader as the first file of that format is opened, so a run loads only those its files need.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from streamer.errors import InputError, reading
from streamer.io import fast5, pod5, slow5
from streamer.io.signal_record import SignalRecord

log = logging.getLogger(__name__)

SIGNAL_SUFFIXES = (".fast5", ".pod5", ".blow5", ".slow5")

_MAGIC = (
    (b"\x89HDF\r\n\x1a\n", "fast5"),
    (pod5.SIGNATURE, "pod5"),
    (slow5.BLOW5_MAGIC, "blow5"),
    (slow5.SLOW5_TEXT_MAGIC, "slow5"),
)
_SNIFF = max(len(m) for m, _ in _MAGIC)


def signal_format(path: str | Path) -> str:
    """`fast5`, `pod5`, `blow5` or `slow5`, from the content, else from the extension."""
    with reading(path, "signal"), open(path, "rb") as fh:
        head = fh.read(_SNIFF)
    for magic, fmt in _MAGIC:
        if head.startswith(magic):
            return fmt
    suffix = Path(path).suffix.lower()
    if suffix in SIGNAL_SUFFIXES:
        return suffix[1:]
    raise InputError(path, "not a signal file (neither FAST5, POD5, SLOW5 nor BLOW5 content)")


def is_signal_file(path: Path) -> bool:
    return path.suffix.lower() in SIGNAL_SUFFIXES and path.is_file()


def find_signal_files(paths: Iterable[str | Path]) -> list[Path]:
    """Signal files named directly (any name) or found (recursively, by extension) under folders, sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(f for f in p.rglob("*") if is_signal_file(f))
        elif p.is_file():
            found.append(p)
        else:
            raise InputError(p, "no such signal file or folder")
    return sorted(set(found))


class _Reader(NamedTuple):
    """One format's reader functions, and the libraries they import as the first file is opened."""

    read_ids: Callable[[Path], list[str]]
    read: Callable[[Path, str], SignalRecord]
    read_many: Callable[[Path, Iterable[str]], Iterator[SignalRecord]]
    iterate: Callable[[Path], Iterator[SignalRecord]]
    libraries: tuple[str, ...]


_FAST5 = _Reader(fast5.fast5_read_ids, fast5.read_fast5, fast5.read_fast5_many, fast5.iter_fast5, fast5.LIBRARIES)
_POD5 = _Reader(pod5.pod5_read_ids, pod5.read_pod5, pod5.read_pod5_many, pod5.iter_pod5, pod5.LIBRARIES)
_SLOW5 = _Reader(slow5.slow5_read_ids, slow5.read_slow5, slow5.read_slow5_many, slow5.iter_slow5, slow5.LIBRARIES)
_READERS = {"fast5": _FAST5, "pod5": _POD5, "blow5": _SLOW5, "slow5": _SLOW5}


def reader_libraries(suffixes: Iterable[str]) -> list[str]:
    """The libraries that reading files with these suffixes imports: what a process that forks
    readers imports once, before it forks them."""
    formats = {s.lower().lstrip(".") for s in suffixes} & _READERS.keys()
    return sorted({lib for fmt in formats for lib in _READERS[fmt].libraries})


def _reader(path: Path) -> _Reader:
    return _READERS[signal_format(path)]


def signal_read_ids(path: Path) -> list[str]:
    """Read ids stored in a signal file, in file order."""
    return _reader(path).read_ids(path)


def read_signal(path: Path, read_id: str) -> SignalRecord:
    """One read's raw signal and calibration, by random access."""
    return _reader(path).read(path, read_id)


def read_signals(path: Path, read_ids: Iterable[str]) -> Iterator[SignalRecord]:
    """The named reads that the file holds, opening it once (the order is the format's)."""
    return _reader(path).read_many(path, read_ids)


def iter_signal(path: Path) -> Iterator[SignalRecord]:
    """Every read of a signal file, in file order; the file is open only while iterating."""
    return _reader(path).iterate(path)


def is_complete(path: Path) -> bool:
    """Cheap test that a writer has finished the file, for a watcher of a live run.

    POD5 ends with its signature and BLOW5 with its end-of-file marker; SLOW5 text ends
    with a newline; FAST5 (HDF5) has no trailer, so the test is that it opens.
    """
    try:
        fmt = signal_format(path)
    except InputError:
        return False
    if fmt == "pod5":
        return pod5.pod5_is_complete(path)
    if fmt in ("blow5", "slow5"):
        return slow5.slow5_is_complete(path)
    return fast5.fast5_is_complete(path)
