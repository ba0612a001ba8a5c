"""Typed messages a subscriber receives, decoded from `[topic, header, payload]` frames.

Column payloads decode to numpy arrays that view the received buffers
(read-only); string columns are object arrays of `str`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from streamer.publish.protocol import (
    CALL_COLUMNS,
    FREQ_COLUMNS,
    SNAPSHOT_REQUEST,
    Header,
    ProtocolError,
    Topic,
    decode_columns,
    unpack,
)


@dataclass(frozen=True, eq=False)
class CallBatch:
    """Per-read CpG calls, one array per nanopolish call-methylation TSV column."""

    chromosome: np.ndarray
    strand: np.ndarray
    start: np.ndarray
    end: np.ndarray
    read_name: np.ndarray
    log_lik_ratio: np.ndarray
    log_lik_methylated: np.ndarray
    log_lik_unmethylated: np.ndarray
    num_calling_strands: np.ndarray
    num_motifs: np.ndarray
    sequence: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    def rows(self) -> Iterator[tuple]:
        """Calls as tuples in TSV column order (Python scalars)."""
        return zip(*(getattr(self, f.name).tolist() for f in fields(self)))


@dataclass(frozen=True, eq=False)
class SiteFrequencies:
    """Per-site counts, one array per FREQ_COLUMNS column (f5c meth-freq's and modkit bedMethyl's)."""

    source: np.ndarray
    chromosome: np.ndarray
    start: np.ndarray
    end: np.ndarray
    strand: np.ndarray
    mod_code: np.ndarray
    num_motifs_in_group: np.ndarray
    called_sites: np.ndarray
    called_sites_methylated: np.ndarray
    group_sequence: np.ndarray
    count_canonical: np.ndarray
    count_other_mod: np.ndarray
    count_delete: np.ndarray
    count_fail: np.ndarray
    count_diff: np.ndarray
    count_nocall: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    @property
    def methylated_frequency(self) -> np.ndarray:
        return self.called_sites_methylated / np.maximum(self.called_sites, 1)

    def columns(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Calls:
    header: Header
    calls: CallBatch


@dataclass(frozen=True)
class FreqUpdate:
    """Absolute counts of the sites one batch changed."""

    header: Header
    sites: SiteFrequencies


@dataclass(frozen=True)
class EventAlign:
    header: Header
    columns: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Status:
    """Heartbeat: the daemon's counters and the last sequence number sent per topic."""

    header: Header
    state: str
    """'running', or 'closed' on the publisher's last message."""
    heartbeat_interval: float
    snapshot: str | None
    counters: Mapping[str, Any]
    sent: int
    dropped: int
    queued_bytes: int
    last_seq: Mapping[str, int]


@dataclass(frozen=True)
class Tuning:
    header: Header
    decision: Mapping[str, Any]


@dataclass(frozen=True)
class RunEvent:
    header: Header
    event: str
    """'start', 'end' or 'summary'."""
    info: Mapping[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """Every site's counts as of `header.seq` on `meth.freq`, and the latest counters."""

    header: Header
    sites: SiteFrequencies
    counters: Mapping[str, Any]


@dataclass(frozen=True)
class Gap:
    """Messages on `topic` that never arrived: seqs first_missing .. first_missing + missed - 1."""

    topic: str
    first_missing: int
    missed: int


Message = Calls | FreqUpdate | EventAlign | Status | Tuning | RunEvent | Snapshot | Gap


def decode_message(frames: Sequence[bytes | memoryview]) -> Message:
    if len(frames) != 3:
        raise ProtocolError(f"expected [topic, header, payload], got {len(frames)} frames")
    topic = bytes(frames[0]).decode("utf-8", "replace")
    header = Header.decode(topic, frames[1])
    body = unpack(frames[2])
    try:
        match topic:
            case Topic.CALLS:
                return Calls(header, CallBatch(**decode_columns(body, CALL_COLUMNS)))
            case Topic.FREQ:
                return FreqUpdate(header, SiteFrequencies(**decode_columns(body, FREQ_COLUMNS)))
            case Topic.EVENTALIGN:
                return EventAlign(header, decode_columns(body, None))
            case Topic.STATUS:
                pub = body["publisher"]
                return Status(header, body["state"], body["heartbeat_interval"], body["snapshot"], body["counters"],
                              pub["sent"], pub["dropped"], pub["queued_bytes"], body["last_seq"])
            case Topic.TUNING:
                return Tuning(header, body["decision"])
            case Topic.RUN:
                return RunEvent(header, body["event"], body["info"])
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"{topic}: malformed payload: {exc!r}") from exc
    raise ProtocolError(f"unknown topic {topic!r}")


def decode_snapshot(frames: Sequence[bytes | memoryview]) -> Snapshot:
    """A snapshot reply, `[b"snapshot", header, payload]` (the DEALER's empty frame removed)."""
    if len(frames) != 3 or bytes(frames[0]) != SNAPSHOT_REQUEST:
        raise ProtocolError(f"not a snapshot reply ({len(frames)} frames)")
    header = Header.decode(SNAPSHOT_REQUEST.decode(), frames[1])
    body = unpack(frames[2])
    try:
        return Snapshot(header, SiteFrequencies(**decode_columns(body["sites"], FREQ_COLUMNS)), body["counters"])
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"snapshot: malformed payload: {exc!r}") from exc
