"""modBAM: the input alignments with CpG calls as `MM:Z:C+m?,...;` and `ML:B:C,...` tags.

Every C of a called CpG group gets the group's probability 1/(1+exp(-llr)), written as
floor(p * 256) capped at 255 (SAMtags 1.7: value N stands for [N/256, (N+1)/256)). The C is
the read's base aligned to the CpG's C on the read's strand (reference position p forward,
p + 1 reverse); a site where the read has no such base (deletion, mismatch) is left out. `?`
marks the other Cs as not called. Deltas count Cs of the read as sequenced, so on reverse
records they run over the reverse complement of SEQ, as the spec says.

All C+m calls in the output are streamer's: an existing MM (or draft Mm) entry for C on the +
strand that includes mod code `m` is removed from every record, with its ML values; other
entries (e.g. 6mA) are kept and ours is appended. Draft Mm/Ml become MM/ML on records that get
calls, and MN is set to the SEQ length there. Move tables and all other tags are left intact;
records are written in input order, so a sorted input stays sorted (and is indexed).
"""

from __future__ import annotations

import array
import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pysam

from streamer.errors import InputError
from streamer.io.alignments import AlignmentFilter
from streamer_plugins.cpg.calls import MethCalls
from streamer.skips import Skip

_COMPLEMENT = str.maketrans("ACGTN", "TGCAN")
_OURS = "C+m?"


def probability_code(llr: float) -> int:
    """ML byte of a call: floor(p * 256) capped at 255."""
    p = 1.0 / (1.0 + math.exp(-llr)) if llr > -700 else 0.0
    return min(255, int(p * 256))


class ModCalls:
    """Calls per (read id, contig, reverse): CpG C positions on the forward strand and their llr."""

    def __init__(self) -> None:
        self.by_record: dict[tuple[str, str, bool], list[tuple[int, float]]] = defaultdict(list)

    def add(self, read_id: str, chrom: str, reverse: bool, start: int, llr: float, sequence: str) -> None:
        """Add one group call: `start` is the group's first C, `sequence` the TSV's context."""
        sites = self.by_record[read_id, chrom, reverse]
        first = pos = sequence.find("CG")
        while pos != -1:
            sites.append((start + pos - first, llr))
            pos = sequence.find("CG", pos + 1)

    def add_calls(self, calls: MethCalls, read_ids: Sequence[str], ref_names: Sequence[str]) -> None:
        """Add a batch's calls; `read_ids` and `ref_names` are the batch's, per record."""
        for j in range(len(calls)):
            i = int(calls.read[j])
            self.add(read_ids[i], ref_names[i], bool(calls.strand[j] < 0), int(calls.start[j]),
                     float(calls.llr[j]), calls.sequence[j])  # fmt: skip


def _split_existing(mm: str, ml: Sequence[int]) -> tuple[list[str], list[int]]:
    """Entries of an MM tag and their ML values, without C+ entries that carry mod code m."""
    entries, values, at = [], [], 0
    for entry in filter(None, mm.split(";")):
        head, *deltas = entry.split(",")
        codes = head[2:].rstrip(".?")
        n = len(deltas) * (len(codes) if codes.isalpha() else 1)
        if not (head[:2] == "C+" and codes.isalpha() and "m" in codes):
            entries.append(entry)
            values.extend(ml[at : at + n])
        at += n
    return entries, values


def mod_tags(rec: pysam.AlignedSegment, sites: list[tuple[int, float]]) -> tuple[str, list[int]] | None:
    """(MM entry, ML values) for the called sites of one record, or None if none lands on a read C."""
    seq = rec.query_sequence
    if not seq:
        return None
    n = len(seq)
    shift, want = (1, "G") if rec.is_reverse else (0, "C")
    qpos = {r: q for q, r in rec.get_aligned_pairs(matches_only=True)}
    called: dict[int, int] = {}  # position in the read as sequenced -> ML value
    for ref_pos, llr in sites:
        q = qpos.get(ref_pos + shift)
        if q is not None and seq[q].upper() == want:
            called[n - 1 - q if rec.is_reverse else q] = probability_code(llr)
    if not called:
        return None
    sequenced = seq.upper().translate(_COMPLEMENT)[::-1] if rec.is_reverse else seq.upper()
    c_pos = [i for i, b in enumerate(sequenced) if b == "C"]
    deltas, values, prev = [], [], -1
    for pos in sorted(called):
        rank = bisect.bisect_left(c_pos, pos)
        deltas.append(str(rank - prev - 1))
        values.append(called[pos])
        prev = rank
    return ",".join([_OURS, *deltas]), values


def _existing(rec: pysam.AlignedSegment) -> tuple[str, str, list[str], list[int]] | None:
    for mm_tag, ml_tag in (("MM", "ML"), ("Mm", "Ml")):
        if rec.has_tag(mm_tag):
            ml = list(rec.get_tag(ml_tag)) if rec.has_tag(ml_tag) else []
            return (mm_tag, ml_tag, *_split_existing(rec.get_tag(mm_tag), ml))
    return None


def _retag(rec: pysam.AlignedSegment, sites: list[tuple[int, float]] | None) -> None:
    existing = _existing(rec)
    ours = mod_tags(rec, sites) if sites else None
    if existing is None and ours is None:
        return
    mm_tag, ml_tag, entries, values = existing or ("MM", "ML", [], [])
    if ours is not None:
        rec.set_tag(mm_tag, None)
        rec.set_tag(ml_tag, None)
        mm_tag, ml_tag = "MM", "ML"
        entries.append(ours[0])
        values.extend(ours[1])
        rec.set_tag("MN", len(rec.query_sequence), "i")
    if entries:
        rec.set_tag(mm_tag, "".join(e + ";" for e in entries), "Z")
        rec.set_tag(ml_tag, array.array("B", values))
    else:
        rec.set_tag(mm_tag, None)
        rec.set_tag(ml_tag, None)


def write_modbam(bam: str | Path, out: str | Path, calls: ModCalls, filt: AlignmentFilter,
                 command_line: str = "", again: bool = False) -> None:  # fmt: skip
    """Copy `bam` to `out` with each record's calls as MM/ML tags; index `out` if it is sorted.

    `again`: `bam` is an earlier copy of ours, made before late reads were called: its header is
    kept, and only the records of reads in `calls` are tagged (the others carry their tags, and
    the same bytes as a copy of the input with every call)."""
    try:
        src = pysam.AlignmentFile(str(bam), "rb", check_sq=False)
    except (OSError, ValueError) as exc:
        raise InputError(bam, f"cannot open alignments: {exc}") from exc
    with src:
        header = src.header.to_dict()
        if not again:
            ids = {pg.get("ID") for pg in header.get("PG", [])}
            pg_id, n = "streamer", 0
            while pg_id in ids:
                n += 1
                pg_id = f"streamer.{n}"
            header.setdefault("PG", []).append({"ID": pg_id, "PN": "streamer", "CL": command_line or "streamer call"})
        with pysam.AlignmentFile(str(out), "wb", header=header) as dst:
            for rec in src.fetch(until_eof=True):
                key = (rec.query_name, rec.reference_name, rec.is_reverse)
                if again and key not in calls.by_record:
                    dst.write(rec)
                    continue
                sites = None
                if filt.verdict(rec)[0] == Skip.OK:
                    start, end = rec.reference_start, rec.reference_end
                    sites = [s for s in calls.by_record.get(key) or () if start <= s[0] and s[0] + 1 < end]
                _retag(rec, sites)
                dst.write(rec)
        if header.get("HD", {}).get("SO") == "coordinate":
            pysam.index(str(out))
