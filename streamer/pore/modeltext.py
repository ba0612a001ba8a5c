"""Text pore models (nanopolish/f5c format) parsed in one pass, and their cached binary form.

A CpG 9-mer model is 5^9 = 1,953,125 rows (about 80 MB of text): a Python loop over its lines
takes seconds on every start. Here one numba pass finds each row's k-mer and first two numbers,
numpy turns those into ranks and floats (Python's correctly rounded parsing, as before), and a
validated model is kept as `.npz` in a cache folder keyed by the file's content hash, so later
starts only hash the file and read 24 MB. The folder is `$STREAMER_MODEL_CACHE_DIR`, else
`$XDG_CACHE_HOME/streamer/models` (`~/.cache/...`); when it cannot be written the text is parsed
each time and a warning says so. Small files (the shipped r9 6-mers) are parsed, not cached.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

import numba
import numpy as np

from streamer.paths import user_cache_dir

log = logging.getLogger(__name__)

CACHE_MIN_BYTES = 1 << 20  # below this, parsing takes less than reading a cache file costs to manage
_CACHE_VERSION = 1  # bump when the cached arrays or their meaning change
MAX_FIELD = 32  # widest number field read; a longer one is reported as non-numeric

# line kinds found by the scanner
ROW, COMMENT, BLANK = 0, 1, 2


@numba.njit(nogil=True, cache=True)
def scan_lines(data):
    """Split model text into lines and whitespace-separated fields, in one pass.

    Per line (line number = index + 1): its kind (ROW; COMMENT for `#...` or a `kmer ...` column
    line; BLANK), the byte offsets of its first three fields as (start, end) pairs (-1 where
    absent) and its field count.
    """
    n = len(data)
    n_lines = 1
    for i in range(n):
        if data[i] == 10:
            n_lines += 1
    if n > 0 and data[n - 1] == 10:
        n_lines -= 1
    kind = np.empty(n_lines, np.int8)
    spans = np.full((n_lines, 6), -1, np.int64)
    n_fields = np.zeros(n_lines, np.int32)
    pos = 0
    for line in range(n_lines):
        nf = 0
        while pos < n and data[pos] != 10:
            c = data[pos]
            if c == 32 or c == 9 or c == 13:
                pos += 1
                continue
            start = pos
            while pos < n and data[pos] != 10 and data[pos] != 32 and data[pos] != 9 and data[pos] != 13:
                pos += 1
            if nf < 3:
                spans[line, 2 * nf] = start
                spans[line, 2 * nf + 1] = pos
            nf += 1
        pos += 1  # the newline
        n_fields[line] = nf
        s = spans[line, 0]
        if nf == 0:
            kind[line] = BLANK
        elif data[s] == 35:  # '#'
            kind[line] = COMMENT
        elif spans[line, 1] - s == 4 and data[s] == 107 and data[s + 1] == 109 and data[s + 2] == 101 \
                and data[s + 3] == 114:  # 'kmer' column line
            kind[line] = COMMENT
        else:
            kind[line] = ROW
    return kind, spans, n_fields


@numba.njit(nogil=True, cache=True)
def gather_fields(data, start, end, width):
    """Fields data[start:end] as rows of a (n, width) uint8 array, zero-padded (numpy's `S` view)."""
    out = np.zeros((len(start), width), np.uint8)
    for i in range(len(start)):
        for j in range(min(end[i] - start[i], width)):
            out[i, j] = data[start[i] + j]
    return out


def parse_column(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, int]:
    """float64 of each field data[start:end] (Python's correctly rounded parsing), and the index of
    the first that is not a number (-1 if all are)."""
    width = int((end - start).max())
    if width > MAX_FIELD:
        return np.empty(0), int(np.argmax(end - start))
    fields = gather_fields(data, start, end, width).view(f"S{width}").ravel()
    try:
        return fields.astype(np.float64), -1
    except ValueError:
        for i, f in enumerate(fields.tolist()):
            try:
                float(f)
            except ValueError:
                return np.empty(0), i
        raise


def cache_dir() -> Path:
    if env := os.environ.get("STREAMER_MODEL_CACHE_DIR"):
        return Path(env)
    return user_cache_dir() / "models"


def content_key(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cache_path(key: str) -> Path:
    return cache_dir() / f"{key}.v{_CACHE_VERSION}.npz"


def read_cached(key: str) -> dict[str, np.ndarray] | None:
    """The cached arrays for a content hash, or None when absent or unreadable (rebuilt then)."""
    path = cache_path(key)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable model cache, rebuilding it: %s", path, exc)
        return None


def write_cached(key: str, source: Path, arrays: dict[str, np.ndarray]) -> None:
    """Store arrays atomically (a concurrent start reads the old file or the whole new one)."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **arrays)
            os.replace(tmp, cache_path(key))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.warning("%s: cannot cache the parsed model in %s (%s); the text is parsed on every start",
                    source, folder, exc.strerror or exc)
        return
    log.info("%s: parsed once and cached as %s", source, cache_path(key))
