"""FAST5 signal reading: single-read, multi-read and VBZ-compressed files, into picoamperes.

Layouts (told apart by structure, not by the `file_version` attribute, which old tools
set inconsistently):
- single-read: `/Raw/Reads/Read_N/Signal`, read id in `Read_N`'s `read_id` attribute,
  calibration in `/UniqueGlobalKey/channel_id`;
- multi-read: one `/read_<id>` group per read with `Raw/Signal` and `channel_id`.

Every HDF5 failure (missing, truncated or corrupt file, undecodable chunk, missing
group) surfaces as `InputError` naming the file and read, so callers can skip the
read or file instead of crashing on an h5py traceback.

h5py and the VBZ filter are imported as the first file is opened, not with this module: a run
whose signal is all POD5 or BLOW5 never loads them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from streamer.errors import InputError, os_failure
from streamer.io.signal_record import SignalRecord

if TYPE_CHECKING:
    import h5py

log = logging.getLogger(__name__)

_SINGLE_ROOT = "Raw/Reads"
_SINGLE_CHANNEL = "UniqueGlobalKey/channel_id"
_MULTI_PREFIX = "read_"
_VBZ_FILTER_ID = 32020
_CALIBRATION = ("digitisation", "offset", "range", "sampling_rate")
LIBRARIES = ("h5py", "vbz_h5py_plugin")  # imported as the first file is opened (`_h5py`)


def fast5_read_ids(path: str | Path) -> list[str]:
    """Read ids held by a FAST5 file, in the file's (name) order."""
    with _open(path) as f:
        return [read_id for read_id, _ in _read_groups(path, f)]


def iter_fast5(path: str | Path) -> Iterator[SignalRecord]:
    """Yield every read of a FAST5 file; the file stays open only while iterating."""
    with _open(path) as f:
        for read_id, locate in _read_groups(path, f):
            yield _load(path, f, read_id, locate)


def read_fast5_many(path: str | Path, read_ids: Iterable[str]) -> Iterator[SignalRecord]:
    """The named reads the file holds, in the order asked, opening the file once."""
    with _open(path) as f:
        held = dict(_read_groups(path, f))
        for rid in read_ids:
            if rid in held:
                yield _load(path, f, rid, held[rid])


def read_fast5(path: str | Path, read_id: str) -> SignalRecord:
    """Load one read by id; `InputError` if the file does not hold it."""
    with _open(path) as f:
        for rid, locate in _read_groups(path, f, want=read_id):
            if rid == read_id:
                return _load(path, f, rid, locate)
    raise InputError(path, "read not found in this FAST5 file", read_id=read_id)


def fast5_is_complete(path: str | Path) -> bool:
    """Whether HDF5 opens the file: FAST5 has no trailer, so this is the test that a writer has finished it."""
    try:
        with _open(path):
            return True
    except InputError:
        return False


@functools.cache
def _h5py() -> ModuleType:
    """h5py, with the VBZ filter registered (importing its plugin does that)."""
    import h5py
    import vbz_h5py_plugin  # noqa: F401

    return h5py


def _open(path: str | Path) -> h5py.File:
    try:
        return _h5py().File(path, "r")
    except OSError as exc:
        raise InputError(path, _open_failure(exc)) from exc


def _open_failure(exc: OSError) -> str:
    msg = str(exc)
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)):
        return os_failure(exc, "FAST5")
    if "truncated file" in msg:
        return "truncated HDF5 file (incomplete copy, or still being written)"
    if "file signature not found" in msg:
        return "not an HDF5 file (corrupt, or not FAST5)"
    return f"cannot open as HDF5 ({msg})"


# A read's location: (signal dataset path, calibration group path).
_Locate = tuple[str, str]


def _read_groups(path, f: h5py.File, want: str | None = None) -> Iterator[tuple[str, _Locate]]:
    """(read id, (signal path, calibration path)) for each read, without loading signal.

    With `want`, a multi-read file is probed directly for that read's group instead
    of listing all of them.
    """
    try:
        if _SINGLE_ROOT in f:
            log.debug("%s: single-read layout", path)
            for name in f[_SINGLE_ROOT]:
                group = f[f"{_SINGLE_ROOT}/{name}"]
                if "read_id" not in group.attrs:
                    raise InputError(path, f"/{_SINGLE_ROOT}/{name} has no read_id attribute")
                yield _text(group.attrs["read_id"]), (f"/{_SINGLE_ROOT}/{name}/Signal", f"/{_SINGLE_CHANNEL}")
            return
        if want is not None:
            names = [_MULTI_PREFIX + want] if _MULTI_PREFIX + want in f else []
        else:
            names = [n for n in f if n.startswith(_MULTI_PREFIX)]
        if not names and want is None:
            if "UniqueGlobalKey" in f:
                raise InputError(path, "single-read FAST5 without raw signal (no /Raw/Reads group)")
            if "file_version" not in f.attrs:
                raise InputError(path, "HDF5 file without FAST5 structure (no reads, no file_version)")
        log.debug("%s: multi-read layout, %d read groups", path, len(names))
        for name in names:
            yield name[len(_MULTI_PREFIX) :], (f"/{name}/Raw/Signal", f"/{name}/channel_id")
    except (OSError, KeyError, RuntimeError, ValueError) as exc:
        raise InputError(path, f"cannot list reads ({exc})") from exc


def _load(path, f: h5py.File, read_id: str, locate: _Locate) -> SignalRecord:
    signal_path, channel_path = locate
    try:
        if signal_path not in f:
            raise InputError(path, f"no raw signal ({signal_path} missing)", read_id=read_id)
        dset = f[signal_path]
        if not isinstance(dset, _h5py().Dataset) or dset.ndim != 1 or dset.dtype != np.int16:
            raise InputError(path, f"{signal_path} is not a 1-D int16 signal", read_id=read_id)
        try:
            raw = dset[()]
        except OSError as exc:
            raise InputError(path, _read_failure(dset, exc), read_id=read_id) from exc
        if channel_path not in f:
            raise InputError(path, f"no channel calibration ({channel_path} missing)", read_id=read_id)
        attrs = f[channel_path].attrs
        missing = [k for k in _CALIBRATION if k not in attrs]
        if missing:
            raise InputError(path, f"{channel_path} lacks {', '.join(missing)}", read_id=read_id)
        cal = {k: float(np.asarray(attrs[k]).reshape(-1)[0]) for k in _CALIBRATION}
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as exc:
        raise InputError(path, f"unreadable read ({exc})", read_id=read_id) from exc
    if not all(np.isfinite(v) for v in cal.values()) or cal["digitisation"] == 0:
        raise InputError(path, f"invalid channel calibration {cal}", read_id=read_id)
    return SignalRecord(
        read_id=read_id,
        raw=raw,
        digitisation=cal["digitisation"],
        offset=cal["offset"],
        range=cal["range"],
        sample_rate=cal["sampling_rate"],
    )


def _read_failure(dset: h5py.Dataset, exc: OSError) -> str:
    plist = dset.id.get_create_plist()
    filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    if _VBZ_FILTER_ID in filters:
        return f"cannot decode VBZ-compressed signal; corrupt data or VBZ plugin not loaded ({exc})"
    return f"cannot read raw signal; corrupt or truncated data ({exc})"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
