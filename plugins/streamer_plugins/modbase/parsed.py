"""A batch of records with its MM/ML tags parsed by fastcalls.parse: what the pileup and the threshold sample share."""

from __future__ import annotations

import array
from dataclasses import dataclass

import numpy as np
import pysam

from streamer_plugins.modbase import fastcalls

SEQ_CODE = np.full(256, 4, dtype=np.uint8)
for _i, _b in enumerate("ACGT"):
    SEQ_CODE[ord(_b)] = _i


def offsets(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


@dataclass
class ParsedBatch:
    """SEQ codes (SEQ order) with per-read offsets, and the (base, strand) groups of the usual tags.

    `status[r]` is fastcalls.SLOW for a read whose tags need tags.py. Group arrays (`groups`
    dict: read, base, minus, mode, ncodes, pos_off, pos_end; `codes`) index `positions`
    (forward read positions) and `probs` (float32, one column per code).
    """

    seq: np.ndarray
    seq_off: np.ndarray
    rev: np.ndarray
    status: np.ndarray
    groups: dict[str, np.ndarray]
    codes: np.ndarray
    positions: np.ndarray
    probs: np.ndarray

    def threshold_base(self) -> np.ndarray:
        return np.where(self.groups["minus"] > 0, 3 - self.groups["base"], self.groups["base"])


def _tags(rec: pysam.AlignedSegment) -> tuple[bytes, bytes]:
    """(MM, ML) bytes for the numba parser; a non-ASCII MM byte sends records it cannot read to tags.py."""
    for mm_name, ml_name in (("MM", "ML"), ("Mm", "Ml")):
        if rec.has_tag(mm_name):
            mm = rec.get_tag(mm_name)
            ml = rec.get_tag(ml_name) if rec.has_tag(ml_name) else None
            if not isinstance(ml, array.array) or ml.typecode != "B" or rec.has_tag("MN"):
                return b"\x00", b""
            return mm.encode(), ml.tobytes()
    return b"", b""


def parse_records(records: list[pysam.AlignedSegment]) -> ParsedBatch:
    tags = [_tags(rec) for rec in records]
    seqs = [rec.query_sequence.encode() for rec in records]
    seq = SEQ_CODE[np.frombuffer(b"".join(seqs), np.uint8)]
    seq_off = offsets([len(x) for x in seqs])
    mm = np.frombuffer(b"".join(t[0] for t in tags), np.uint8)
    mm_off = offsets([len(t[0]) for t in tags])
    ml = np.frombuffer(b"".join(t[1] for t in tags), np.uint8)
    ml_off = offsets([len(t[1]) for t in tags])
    rev = np.array([rec.is_reverse for rec in records], np.bool_)
    status = np.zeros(len(records), np.int64)
    cap = fastcalls.MAX_GROUPS * len(records)
    g = {k: np.zeros(cap, np.int64) for k in ("read", "base", "minus", "mode", "ncodes", "pos_off", "pos_end")}
    codes = np.zeros((cap, fastcalls.MAX_CODES), np.int32)
    positions = np.zeros(len(seq), np.int64)
    explicit = np.zeros(len(seq), np.bool_)
    probs = np.zeros((len(seq), fastcalls.MAX_CODES), np.float32)
    n_g, _ = fastcalls.parse(mm, mm_off, ml, ml_off, seq, seq_off, rev, status, g["read"], g["base"], g["minus"],
                             g["mode"], codes, g["ncodes"], g["pos_off"], g["pos_end"], positions, explicit, probs)
    return ParsedBatch(seq, seq_off, rev, status, {k: v[:n_g] for k, v in g.items()}, codes[:n_g], positions, probs)
