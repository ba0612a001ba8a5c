"""The wire format of the result stream (documented in docs/protocol.md).

Every published message is three frames, `[topic, header, payload]`. The header
is a small msgpack map stamped by the publisher; the payload is msgpack with 1-D
numpy arrays carried as raw buffers (an msgpack extension type), so a batch of
calls costs a few memory copies rather than one Python object per value.
Both the publisher and the client import this module, so the two cannot drift.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from streamer.compat import StrEnum

SCHEMA_VERSION = 2  # 2: meth.freq rows name their source, strand and mod code, with modkit's counts

NDARRAY_EXT = 1
"""msgpack extension code of a 1-D numpy array: 8 bytes of dtype string, then the data."""
_DTYPE_BYTES = 8  # keeps the data 8-byte aligned inside the extension payload


class Topic(StrEnum):
    CALLS = "meth.call"
    FREQ = "meth.freq"
    EVENTALIGN = "eventalign"
    STATUS = "status"
    TUNING = "tuning"
    RUN = "run"


SNAPSHOT_REQUEST = b"snapshot"
"""The one request the snapshot (ROUTER) endpoint serves; its reply's first frame too."""

RUN_EVENTS = ("start", "end", "summary")

# Column schemas: name -> dtype, `str` for string columns. Dtypes are fixed so
# every subscriber sees the same arrays whatever the producer handed over.
CALL_COLUMNS: dict[str, Any] = {
    "chromosome": str,
    "strand": str,
    "start": np.int64,
    "end": np.int64,
    "read_name": str,
    "log_lik_ratio": np.float64,
    "log_lik_methylated": np.float64,
    "log_lik_unmethylated": np.float64,
    "num_calling_strands": np.int32,
    "num_motifs": np.int32,
    "sequence": str,
}
"""nanopolish call-methylation TSV columns, in TSV order."""

FREQ_COLUMNS: dict[str, Any] = {
    "source": str,  # "hmm": streamer's signal-level CpG calls; "dorado": the basecaller's MM/ML calls
    "chromosome": str,
    "start": np.int64,
    "end": np.int64,
    "strand": str,  # "+" or "-"; "." for both strands (HMM rows, combined-strand modkit rows)
    "mod_code": str,  # "m" 5mC, "h" 5hmC, "a" 6mA, ... (HMM rows: "m")
    "num_motifs_in_group": np.int32,  # dorado rows: 1
    "called_sites": np.int64,  # dorado rows: bedMethyl's Nvalid_cov
    "called_sites_methylated": np.int64,  # dorado rows: Nmod
    "group_sequence": str,  # dorado rows: ""
    "count_canonical": np.int64,  # HMM rows: called - methylated, the rest 0
    "count_other_mod": np.int64,
    "count_delete": np.int64,
    "count_fail": np.int64,
    "count_diff": np.int64,
    "count_nocall": np.int64,
}
"""Per-site counts of either source: f5c meth-freq's columns (less `methylated_frequency`, which
is derived) and modkit bedMethyl's; a site is (source, chromosome, start, end, strand, mod_code)."""

SITE_KEY = ("source", "chromosome", "start", "end", "strand", "mod_code")


class ProtocolError(ValueError):
    """A message does not follow the protocol (wrong frames, version or schema)."""


@dataclass(frozen=True, eq=False)
class Categorical:
    """A string column given as distinct values plus one code per row.

    The cheap way to hand over per-read strings repeated across calls
    (chromosome, strand, read name): codes are the calls' read indices.
    """

    values: Sequence[str]
    codes: np.ndarray

    def __len__(self) -> int:
        return len(self.codes)


@dataclass(frozen=True)
class Header:
    topic: str
    version: int
    run_id: str
    seq: int
    time_ns: int

    def encode(self) -> bytes:
        return msgpack.packb({"v": self.version, "run": self.run_id, "seq": self.seq, "t": self.time_ns})

    @classmethod
    def decode(cls, topic: str, frame: bytes | memoryview) -> Header:
        try:
            h = msgpack.unpackb(frame)
            header = cls(topic, h["v"], h["run"], h["seq"], h["t"])
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
            raise ProtocolError(f"{topic}: malformed header: {exc}") from exc
        if header.version != SCHEMA_VERSION:
            raise ProtocolError(f"{topic}: schema version {header.version}, this client speaks {SCHEMA_VERSION}")
        return header


def stamp(topic: str, run_id: str, seq: int) -> bytes:
    return Header(topic, SCHEMA_VERSION, run_id, seq, time.time_ns()).encode()


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.ndim != 1 or obj.dtype.kind not in "biuf":
            raise TypeError(f"only 1-D numeric arrays go on the wire, not {obj.dtype}{obj.shape}")
        tag = obj.dtype.str.encode("ascii").ljust(_DTYPE_BYTES, b"\0")
        return msgpack.ExtType(NDARRAY_EXT, b"".join((tag, memoryview(np.ascontiguousarray(obj)).cast("B"))))
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code != NDARRAY_EXT:
        return msgpack.ExtType(code, data)
    return np.frombuffer(data, dtype=data[:_DTYPE_BYTES].rstrip(b"\0").decode("ascii"), offset=_DTYPE_BYTES)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default)


def unpack(frame: bytes | memoryview) -> Any:
    try:
        return msgpack.unpackb(frame, ext_hook=_ext_hook, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"malformed payload: {exc}") from exc


def _encode_strings(column: Any) -> dict[str, Any]:
    if isinstance(column, Categorical):
        return {"values": list(column.values), "codes": np.asarray(column.codes, dtype=np.uint32)}
    if isinstance(column, np.ndarray):
        column = column.tolist()
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(s, len(index)) for s in column), dtype=np.uint32, count=len(column))
    return {"values": list(index), "codes": codes}


def _encode_column(column: Any, dtype: Any) -> Any:
    if dtype is str:
        return _encode_strings(column)
    if isinstance(column, Categorical):
        raise TypeError("a numeric column cannot be Categorical")
    return np.asarray(column, dtype=dtype)


def _infer_dtype(column: Any) -> Any:
    if isinstance(column, Categorical):
        return str
    if isinstance(column, np.ndarray):
        return column.dtype if column.dtype.kind in "biuf" else str
    return str if len(column) and isinstance(column[0], str) else None


def encode_columns(columns: Mapping[str, Any], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """Columns as a payload map; with a schema the names must match it exactly.

    Without a schema (eventalign) numeric columns keep their dtype and
    sequences of `str` become string columns.
    """
    if schema is not None and set(columns) != set(schema):
        missing, extra = sorted(set(schema) - set(columns)), sorted(set(columns) - set(schema))
        raise ValueError(f"columns do not match the schema: missing {missing}, unexpected {extra}")
    lengths = {name: len(col) for name, col in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"columns differ in length: {lengths}")
    dtypes = schema if schema is not None else {name: _infer_dtype(col) for name, col in columns.items()}
    encoded = {name: _encode_column(columns[name], dtypes[name]) for name in (schema or columns)}
    return {"n": next(iter(lengths.values()), 0), "columns": encoded}


def decode_columns(payload: Mapping[str, Any], schema: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """Payload map back to arrays; string columns become object arrays of `str`."""
    try:
        n, encoded = payload["n"], payload["columns"]
        if schema is not None and set(encoded) != set(schema):
            raise ProtocolError(f"columns {sorted(encoded)} do not match the schema {sorted(schema)}")
        columns = {}
        for name, col in encoded.items():
            if isinstance(col, Mapping):
                col = np.asarray(col["values"], dtype=object)[col["codes"]]
            if len(col) != n:
                raise ProtocolError(f"column {name} has {len(col)} rows, expected {n}")
            columns[name] = col
    except (KeyError, TypeError, IndexError) as exc:
        raise ProtocolError(f"malformed columns: {exc!r}") from exc
    return columns
