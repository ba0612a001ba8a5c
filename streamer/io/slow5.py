"""SLOW5/BLOW5 signal reading into the `SignalRecord` the FAST5 reader gives.

SLOW5 stores each read's `digitisation`, `offset`, `range` and `sampling_rate` as doubles,
exactly as FAST5 does, so `SignalRecord.to_pa()` gives the FAST5 route's pA bits.

The reader calls slow5lib, the C library that the `pyslow5` package ships, through its
public C API rather than through `pyslow5.Open`, because that wrapper is unsafe for a
long-running reader: it dereferences NULL (a segfault) when a file cannot be opened,
stops iteration silently on a corrupt record, returns None for a damaged read as for a
missing one, adds a logging handler on every open, and writes `<file>.idx` beside the
data (impossible in a read-only run folder, and stale for a file still being written).
Here every failure carries slow5lib's error code into an `InputError`, and the index
that random access needs lives in a cache folder, keyed by the file's path, size and
modification time: `$STREAMER_SLOW5_INDEX_DIR`, else `$XDG_CACHE_HOME/streamer/slow5-index`
(`~/.cache/...`). slow5lib releases the GIL, so threads can read in parallel. pyslow5 is imported
as the first file is opened, not with this module.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import struct
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from streamer.errors import InputError, StreamerError, reading
from streamer.io.signal_record import SignalRecord
from streamer.paths import user_cache_dir

log = logging.getLogger(__name__)

BLOW5_MAGIC = b"BLOW5\x01"
BLOW5_EOF = b"5WOLB"
SLOW5_TEXT_MAGIC = b"#slow5_version"
LIBRARIES = ("pyslow5",)  # imported as the first file is opened (`_c`)

_FORMAT_ASCII, _FORMAT_BINARY = 1, 2  # enum slow5_fmt
_BLOW5_HEADER_SIZE_AT = 64
_LOG_OFF, _EXIT_OFF = 0, 0  # we report errors ourselves; never let the library exit()
_ERR_EOF, _ERR_NOTFOUND = -1, -7
_ERRORS = {
    -2: "bad argument",
    -3: "truncated file",
    -4: "malformed record",
    -5: "I/O error",
    -6: "index not loaded",
    -7: "read not found",
    -8: "internal error",
    -9: "unknown file format",
    -10: "out of memory",
    -11: "no auxiliary map",
    -12: "field not found",
    -13: "cannot decompress (corrupt data)",
    -14: "invalid magic number",
    -15: "incompatible SLOW5 version",
    -16: "malformed header",
    -17: "wrong field type",
}


class _Rec(ctypes.Structure):
    """`struct slow5_rec` (slow5.h), the primary fields of one read."""

    _fields_ = [
        ("read_id_len", ctypes.c_uint16),
        ("read_id", ctypes.c_void_p),
        ("read_group", ctypes.c_uint32),
        ("digitisation", ctypes.c_double),
        ("offset", ctypes.c_double),
        ("range", ctypes.c_double),
        ("sampling_rate", ctypes.c_double),
        ("len_raw_signal", ctypes.c_uint64),
        ("raw_signal", ctypes.POINTER(ctypes.c_int16)),
        ("aux_map", ctypes.c_void_p),
    ]


_RecPtr = ctypes.POINTER(_Rec)


@functools.cache
def _c() -> ctypes.CDLL:
    """slow5lib inside the pyslow5 extension module, bound on first use."""
    import pyslow5

    try:
        lib = ctypes.CDLL(pyslow5.__file__)
        _declare(lib)
    except (OSError, AttributeError) as exc:
        raise StreamerError(f"cannot bind slow5lib in the pyslow5 module {pyslow5.__file__} ({exc})") from exc
    lib.slow5_set_log_level(_LOG_OFF)
    lib.slow5_set_exit_condition(_EXIT_OFF)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    sigs = {
        "slow5_open_with": ([ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int], ctypes.c_void_p),
        "slow5_close": ([ctypes.c_void_p], ctypes.c_int),
        "slow5_idx_to": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int),
        "slow5_idx_load_with": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int),
        "slow5_idx_unload": ([ctypes.c_void_p], None),
        "slow5_get": ([ctypes.c_char_p, ctypes.POINTER(_RecPtr), ctypes.c_void_p], ctypes.c_int),
        "slow5_get_next": ([ctypes.POINTER(_RecPtr), ctypes.c_void_p], ctypes.c_int),
        "slow5_rec_free": ([_RecPtr], None),
        "slow5_get_rids": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)], ctypes.POINTER(ctypes.c_char_p)),
        "slow5_errno_location": ([], ctypes.POINTER(ctypes.c_int)),
        "slow5_set_log_level": ([ctypes.c_int], None),
        "slow5_set_exit_condition": ([ctypes.c_int], None),
    }
    for name, (argtypes, restype) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype


def slow5_is_complete(path: str | Path) -> bool:
    """True once a BLOW5 file ends with its end-of-file marker, or a SLOW5 text file with a newline."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SLOW5_TEXT_MAGIC))
            size = fh.seek(0, 2)
            tail_len = len(BLOW5_EOF) if head.startswith(BLOW5_MAGIC) else 1
            if size < len(head) + tail_len:
                return False
            fh.seek(-tail_len, 2)
            tail = fh.read()
    except OSError:
        return False
    if head.startswith(BLOW5_MAGIC):
        return tail == BLOW5_EOF
    return head == SLOW5_TEXT_MAGIC and tail == b"\n"


def slow5_read_ids(path: str | Path) -> list[str]:
    """Read ids held by a SLOW5/BLOW5 file, in file order (from its index)."""
    with _open(path) as s5:
        _load_index(path, s5)
        n = ctypes.c_uint64(0)
        _clear_error()
        rids = _c().slow5_get_rids(s5, ctypes.byref(n))
        if not rids:
            raise InputError(path, f"cannot list reads ({_last_error()})")
        return [_text(path, rids[i]) for i in range(n.value)]


def iter_slow5(path: str | Path) -> Iterator[SignalRecord]:
    """Yield every read in file order (sequential decoding, no index needed)."""
    with _open(path) as s5, _record_buffer() as rec:
        _check_framing(path)
        while True:
            ret = _c().slow5_get_next(ctypes.byref(rec), s5)
            if ret == _ERR_EOF:
                return
            if ret < 0:
                raise InputError(path, f"unreadable record after the last good read ({_ERRORS.get(ret, ret)})")
            yield _record(path, rec.contents)


def read_slow5(path: str | Path, read_id: str) -> SignalRecord:
    """Load one read by id through the file's index."""
    for rec in read_slow5_many(path, [read_id]):
        return rec
    raise InputError(path, "read not found in this SLOW5 file", read_id=read_id)


def read_slow5_many(path: str | Path, read_ids: Iterable[str]) -> Iterator[SignalRecord]:
    """Yield the named reads that the file holds, in the order asked, opening the file once."""
    with _open(path) as s5, _record_buffer() as rec:
        _load_index(path, s5)
        for read_id in read_ids:
            ret = _c().slow5_get(read_id.encode(), ctypes.byref(rec), s5)
            if ret == _ERR_NOTFOUND:
                continue
            if ret < 0:
                raise InputError(path, f"unreadable read ({_ERRORS.get(ret, ret)})", read_id=read_id)
            yield _record(path, rec.contents, read_id)


def write_blow5(path: str | Path, records: Iterable[SignalRecord], header: Mapping[str, str] | None = None,
                threads: int = 1) -> int:
    """Write reads to a new BLOW5 file with pyslow5's writer (zlib records, svb-zd signal).

    The calibration doubles are stored as they are, so the pA bits read back unchanged.
    `header` sets run attributes (e.g. `flow_cell_product_code`, `sequencing_kit`, which
    tell the pore). With threads > 1, records are compressed on that many threads, 512 at a
    time. For tests, benchmarks and replays; returns how many reads were written.
    """
    path = Path(path)
    if path.suffix != ".blow5":
        raise ValueError(f"{path}: pyslow5 picks the format from the extension; name it .blow5")
    import pyslow5

    s5 = pyslow5.Open(str(path), "w")
    n = 0
    batch: dict = {}
    try:
        if s5.write_header({**{key: "" for key in s5.get_empty_header()}, **(header or {})}) != 0:
            raise StreamerError(f"{path}: pyslow5 could not write the header")
        for rec in records:
            row = s5.get_empty_record()
            row.update(read_id=rec.read_id, digitisation=rec.digitisation, offset=rec.offset, range=rec.range,
                       sampling_rate=rec.sample_rate, len_raw_signal=len(rec.raw), signal=rec.raw)
            n += 1
            if threads > 1:
                batch[rec.read_id] = row
                if len(batch) == 512:
                    s5.write_record_batch(batch, threads=threads, batchsize=512)
                    batch = {}
            elif s5.write_record(row) != 0:
                raise StreamerError(f"{path}: pyslow5 could not write read {rec.read_id}")
        if batch:
            s5.write_record_batch(batch, threads=threads, batchsize=512)
    finally:
        s5.close()
    return n


def index_dir() -> Path:
    """Where SLOW5 indexes are cached (never beside the data)."""
    if env := os.environ.get("STREAMER_SLOW5_INDEX_DIR"):
        return Path(env)
    return user_cache_dir() / "slow5-index"


@contextmanager
def _open(path: str | Path) -> Iterator[int]:
    fmt = _check_file(path)
    _clear_error()
    s5 = _c().slow5_open_with(os.fsencode(path), b"r", fmt)
    if not s5:
        raise InputError(path, f"cannot open as SLOW5 ({_last_error()})")
    try:
        yield s5
    finally:
        _c().slow5_idx_unload(s5)
        _c().slow5_close(s5)


def _check_file(path: str | Path) -> int:
    """The slow5lib format for the file's content; `InputError` if it is not SLOW5 or is cut short."""
    with reading(path, "SLOW5"):
        with open(path, "rb") as fh:
            head = fh.read(len(SLOW5_TEXT_MAGIC))
            if head.startswith(BLOW5_MAGIC):
                size = fh.seek(0, 2)
                fh.seek(max(size - len(BLOW5_EOF), 0))
                if fh.read() != BLOW5_EOF:
                    raise InputError(path, "truncated BLOW5 file (no end-of-file marker: incomplete copy, or still being written)")
                return _FORMAT_BINARY
            if head == SLOW5_TEXT_MAGIC:
                fh.seek(-1, 2)
                if fh.read() != b"\n":
                    raise InputError(path, "truncated SLOW5 file (last line unterminated: incomplete copy, or still being written)")
                return _FORMAT_ASCII
            raise InputError(path, "not a SLOW5/BLOW5 file (no SLOW5 header)")


def _check_framing(path: str | Path) -> None:
    """Walk a BLOW5 file's record sizes: slow5lib trusts them and crashes on a damaged one.

    Layout: the ASCII header's length (uint32) at byte 64, the header, then records as
    (uint64 length, bytes), then the 5-byte end-of-file marker.
    """
    with open(path, "rb") as fh:
        if fh.read(len(BLOW5_MAGIC)) != BLOW5_MAGIC:
            return
        end = fh.seek(0, 2) - len(BLOW5_EOF)
        fh.seek(_BLOW5_HEADER_SIZE_AT)
        field = fh.read(4)
        if len(field) != 4:
            raise InputError(path, "corrupt BLOW5 file (header cut short)")
        (header_size,) = struct.unpack("<I", field)
        pos = _BLOW5_HEADER_SIZE_AT + 4 + header_size
        n = 0
        while pos < end:
            fh.seek(pos)
            (size,) = struct.unpack("<Q", fh.read(8)) if pos + 8 <= end else (end,)
            pos += 8 + size
            n += 1
        if pos != end:
            raise InputError(path, f"corrupt BLOW5 file (record {n} overruns the file: damaged record length)")


def _load_index(path: str | Path, s5: int) -> None:
    """Load the cached index of this exact file version, building it first if absent."""
    st = os.stat(path)
    digest = hashlib.sha1(os.fsencode(os.path.realpath(path))).hexdigest()[:20]
    name = f"{digest}-{st.st_size}-{st.st_mtime_ns}.idx"
    try:
        folder = index_dir()
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("SLOW5 index folder unusable (%s); indexing %s in memory only", exc, path)
        with tempfile.TemporaryDirectory() as tmp:
            _build_index(path, s5, Path(tmp) / name)
            _load_index_file(path, s5, Path(tmp) / name)
        return
    idx = folder / name
    if idx.is_file() and _c().slow5_idx_load_with(s5, os.fsencode(idx)) == 0:
        return
    _c().slow5_idx_unload(s5)
    _build_index(path, s5, idx)
    for stale in folder.glob(f"{digest}-*.idx"):
        if stale.name != name:
            stale.unlink(missing_ok=True)
    _load_index_file(path, s5, idx)


def _build_index(path: str | Path, s5: int, idx: Path) -> None:
    _check_framing(path)
    tmp = idx.with_name(f"{idx.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    _clear_error()
    try:
        if _c().slow5_idx_to(s5, os.fsencode(tmp)) != 0:
            raise InputError(path, f"cannot index ({_last_error()})")
        os.replace(tmp, idx)  # atomic: concurrent readers see a whole index or none
    finally:
        tmp.unlink(missing_ok=True)
    log.debug("%s: indexed into %s", path, idx)


def _load_index_file(path: str | Path, s5: int, idx: Path) -> None:
    _clear_error()
    if _c().slow5_idx_load_with(s5, os.fsencode(idx)) != 0:
        raise InputError(path, f"cannot load its index {idx} ({_last_error()})")


@contextmanager
def _record_buffer() -> Iterator[_RecPtr]:
    """A record pointer that slow5lib allocates on first use and reuses; freed on exit."""
    rec = _RecPtr()
    try:
        yield rec
    finally:
        if rec:
            _c().slow5_rec_free(rec)


def _record(path: str | Path, rec: _Rec, read_id: str | None = None) -> SignalRecord:
    read_id = read_id or _text(path, ctypes.string_at(rec.read_id, rec.read_id_len))
    n = rec.len_raw_signal
    raw = np.ctypeslib.as_array(rec.raw_signal, shape=(n,)).copy() if n else np.empty(0, np.int16)
    cal = (rec.digitisation, rec.offset, rec.range, rec.sampling_rate)
    if not all(np.isfinite(v) for v in cal) or rec.digitisation == 0 or rec.sampling_rate <= 0:
        raise InputError(path, f"invalid calibration (digitisation, offset, range, sampling_rate) = {cal}", read_id=read_id)
    return SignalRecord(
        read_id=read_id,
        raw=raw,
        digitisation=rec.digitisation,
        offset=rec.offset,
        range=rec.range,
        sample_rate=rec.sampling_rate,
    )


def _text(path: str | Path, raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise InputError(path, f"corrupt read id {raw[:40]!r}") from exc


def _clear_error() -> None:
    _c().slow5_errno_location()[0] = 0


def _last_error() -> str:
    """slow5lib's error code (thread-local), cleared by `_clear_error` before the call."""
    code = _c().slow5_errno_location()[0]
    return _ERRORS.get(code, "unknown error" if code == 0 else f"slow5lib error {code}")
