"""MM/ML (and the draft Mm/Ml) modified-base tags of one record, read the way modkit 0.4.4 reads them.

Positions in MM count bases of the read as sequenced (the reverse complement of SEQ on
reverse records); entries for the same (base, strand) are merged, and `.` or an absent mode
fills every other base of that kind with an implicit canonical call (probability 0 for each
code of the entry). A record whose tags are malformed raises `ModTagError`; the pileup then
treats the read as having no calls, as modkit does.
"""

from __future__ import annotations

import array
import warnings
from dataclasses import dataclass

import numpy as np
import pysam

BASES = "ACGT"
_CODE = np.full(256, 4, dtype=np.uint8)
for _i, _b in enumerate(BASES):
    _CODE[ord(_b)] = _i
_CODE[ord("U")] = 3
MAX_PROB = np.float32(1.01)

EXPLICIT, IMPLICIT, DEFAULT_IMPLICIT = "?", ".", ""


class ModTagError(ValueError):
    """The record's modified-base tags cannot be used; the message says why."""


class NoModTags(ModTagError):
    """The record carries no MM tag (not an error: the read simply has no calls)."""


@dataclass
class ModGroup:
    """All calls of one (base, MM strand) of a read, positions on the read as sequenced."""

    base: int  # 0..3, the base of the MM entry (ACGT)
    minus: bool  # MM strand '-' (a call on the opposite strand, as in duplex)
    mode: str  # EXPLICIT, IMPLICIT or DEFAULT_IMPLICIT, as modkit combines them
    codes: tuple[str, ...]  # mod codes, letters or ChEBI numbers
    positions: np.ndarray  # int64[n], forward read positions, ascending
    probs: np.ndarray  # float32[n, len(codes)]; NaN where a code has no value at a position

    @property
    def threshold_base(self) -> int:
        """The base the call is about: the entry's base, or its complement for '-'."""
        return 3 - self.base if self.minus else self.base


def forward_codes(rec: pysam.AlignedSegment) -> np.ndarray:
    """SEQ as base codes 0..3 (4 for anything else), in read-as-sequenced orientation."""
    seq = rec.query_sequence or ""
    codes = _CODE[np.frombuffer(seq.encode(), dtype=np.uint8)]
    if rec.is_reverse:
        codes = codes[::-1].copy()
        known = codes < 4
        codes[known] = 3 - codes[known]
    return codes


def _tag(rec: pysam.AlignedSegment, names: tuple[str, str]):
    for name in names:
        if rec.has_tag(name):
            return rec.get_tag(name)
    return None


def _parse_header(entry: str) -> tuple[str, bool, tuple[str, ...], str, str]:
    head, _, rest = entry.partition(",")
    if len(head) < 2 or head[0] not in "ACGTUN" or head[1] not in "+-":
        raise ModTagError(f"MM entry {head!r} does not start with a base and a strand")
    body = head[2:]
    codes: list[str] = []
    mode = DEFAULT_IMPLICIT
    i = 0
    if body[:1].isdigit():
        while i < len(body) and body[i].isdigit():
            i += 1
        codes.append(str(int(body[:i])))
    chebi = bool(codes)
    for c in body[i:]:
        if c in "?.":
            mode = c
        elif c.isascii() and c.isalpha() and not chebi:
            codes.append(c)
        else:
            raise ModTagError(f"unknown modification code {c!r} in MM entry {head!r}")
    return head[0], head[1] == "-", tuple(codes), mode, rest


def _positions(fseq: np.ndarray, base: str, deltas: np.ndarray) -> np.ndarray:
    if base == "N":
        pos = np.cumsum(deltas + 1) - 1
        if len(pos) and pos[-1] >= len(fseq):
            raise ModTagError("MM position past the end of the read")
        return pos
    occurrences = np.flatnonzero(fseq == _CODE[ord(base)])
    idx = np.cumsum(deltas + 1) - 1
    if len(idx) and idx[-1] >= len(occurrences):
        raise ModTagError(f"MM position past the end of the read ({base} number {idx[-1] + 1} of {len(occurrences)})")
    return occurrences[idx]


def read_mod_groups(rec: pysam.AlignedSegment, fseq: np.ndarray) -> tuple[list[ModGroup], str]:
    """The record's calls, one group per (base, strand), and a note on extra ML values ("" if none).

    Raises NoModTags without an MM tag, ModTagError for tags modkit would refuse.
    """
    mm = _tag(rec, ("MM", "Mm"))
    if mm is None:
        raise NoModTags("no MM tag")
    ml = _tag(rec, ("ML", "Ml"))
    if ml is None:
        raise ModTagError("MM tag without ML tag")
    if not isinstance(ml, array.array) or ml.typecode != "B":
        raise ModTagError("ML tag is not an array of unsigned bytes (B:C)")
    if rec.has_tag("MN") and rec.get_tag("MN") != len(fseq):
        raise ModTagError(f"MN tag {rec.get_tag('MN')} differs from the sequence length {len(fseq)}")
    quals = np.frombuffer(ml, dtype=np.uint8)
    merged: dict[tuple[int, bool], dict] = {}
    pointer = 0
    for entry in str(mm).split(";"):
        if not entry:
            continue
        base, minus, codes, mode, rest = _parse_header(entry)
        deltas = _deltas(rest, entry)
        if (deltas < 0).any():
            raise ModTagError("MM entry has a negative skip count")
        positions = _positions(fseq, base, deltas)
        end = pointer + len(positions) * len(codes)
        if end > len(quals):
            raise ModTagError(f"ML has {len(quals)} values, MM needs at least {end}")
        probs = ((quals[pointer:end].astype(np.float32) + np.float32(0.5)) / np.float32(256)).reshape(len(positions), len(codes))
        pointer = end
        bases = fseq[positions]
        if (bases > 3).any():
            raise ModTagError("MM position on a base that is not A, C, G or T")
        implicit_bases = [] if mode == EXPLICIT else ([_CODE[ord(base)]] if base != "N" else [0, 1, 2, 3])
        if mode != EXPLICIT and base == "N" and (fseq > 3).any():
            raise ModTagError("implicit N entry on a read with non-ACGT bases")
        if base != "N":
            called = [int(_CODE[ord(base)])]
        else:
            called = sorted(set(bases.tolist()))
        for b in sorted(set(called) | set(int(x) for x in implicit_bases)):
            sel = bases == b if base == "N" else slice(None)
            pos, p = positions[sel], probs[sel]
            if b in implicit_bases:  # every other base of the kind: canonical, probability 0 per code
                every = np.flatnonzero(fseq == b)
                at = np.searchsorted(every, pos)
                table = np.zeros((len(every), len(codes)), np.float32)
                table[at] = p
                inferred = np.ones(len(every), bool)
                inferred[at] = False
                pos, p = every, table
            else:
                inferred = np.zeros(len(pos), bool)
            _merge(merged, (b, minus), mode, codes, pos, p, inferred)
    if pointer < len(quals):
        note = f"ML has {len(quals)} values, MM uses {pointer}: the extra values are ignored"
    else:
        note = ""
    return [_group(key, m) for key, m in merged.items()], note


def _deltas(rest: str, entry: str) -> np.ndarray:
    if not rest.strip():
        return np.zeros(0, np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        deltas = np.fromstring(rest, dtype=np.int64, sep=",")
    if len(deltas) != rest.count(",") + 1 or not rest.replace(",", "").replace(" ", "").lstrip("-").isdigit():
        raise ModTagError(f"MM entry {entry.split(',')[0]!r} has a malformed position list")
    return deltas


def _merge(merged: dict, key, mode: str, codes, pos, probs, inferred) -> None:
    """Add one entry's calls (positions ascending) for a (base, strand); modkit's conflict rules decide what is refused."""
    g = merged.get(key)
    if g is None:
        merged[key] = {"mode": mode, "codes": list(codes), "pos": pos, "probs": probs, "inferred": inferred}
        return
    if g["mode"] != mode:
        g["mode"] = IMPLICIT
    for code in codes:
        if code not in g["codes"]:
            g["codes"].append(code)
            g["probs"] = np.concatenate([g["probs"], np.full((len(g["pos"]), 1), np.nan, np.float32)], axis=1)
    if len(pos) == len(g["pos"]) and np.array_equal(pos, g["pos"]):  # the usual case: C+h and C+m at the same Cs
        if (g["inferred"] != inferred).any():
            raise ModTagError("a position is both called and implied canonical")
        table = g["probs"]
        for j, code in enumerate(codes):
            col = table[:, g["codes"].index(code)]
            table[:, g["codes"].index(code)] = np.where(np.isnan(col), probs[:, j], col + probs[:, j])
        if (np.nansum(table, axis=1, dtype=np.float32) > MAX_PROB).any():
            raise ModTagError("modification probabilities at a position sum above 1")
        return
    allpos = np.union1d(g["pos"], pos)
    table = np.full((len(allpos), len(g["codes"])), np.nan, np.float32)
    flags = np.zeros(len(allpos), bool)
    old = np.searchsorted(allpos, g["pos"])
    new = np.searchsorted(allpos, pos)
    table[old] = g["probs"]
    flags[old] = g["inferred"]
    both = np.isin(pos, g["pos"])
    if (flags[new[both]] != inferred[both]).any():
        raise ModTagError("a position is both called and implied canonical")
    flags[new] = inferred
    for j, code in enumerate(codes):
        col = table[new, g["codes"].index(code)]
        table[new, g["codes"].index(code)] = np.where(np.isnan(col), probs[:, j], col + probs[:, j])
    if both.any() and (np.nansum(table[new[both]], axis=1, dtype=np.float32) > MAX_PROB).any():
        raise ModTagError("modification probabilities at a position sum above 1")
    g.update(pos=allpos, probs=table, inferred=flags)


def _group(key: tuple[int, bool], g: dict) -> ModGroup:
    return ModGroup(key[0], key[1], g["mode"], tuple(g["codes"]), g["pos"], g["probs"])
