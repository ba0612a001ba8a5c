"""Writes the modified-base fixtures of tests/test_pileup.py: small.fa and small.bam (sorted, indexed).

    python tests/data/modbase/make_fixture.py

ctg1 = AACGTTACGAACGTAACTAA + T*10; its CpGs are C2-G3, C7-G8, C11-G12, and C16 is a lone C.
Each read exercises one rule; test_pileup.py derives the expected rows from these comments.
"""

from __future__ import annotations

import array
from pathlib import Path

import pysam

HERE = Path(__file__).parent
REF = "AACGTTACGAACGTAACTAA" + "T" * 10


def _record(header, name, flag, pos, cigar, seq, tags):
    rec = pysam.AlignedSegment(header)
    rec.query_name = name
    rec.flag = flag
    rec.reference_id = 0 if not flag & 4 else -1
    rec.reference_start = pos
    rec.mapping_quality = 60 if not flag & 4 else 0
    rec.cigarstring = cigar
    rec.query_sequence = seq
    rec.query_qualities = pysam.qualitystring_to_array("I" * len(seq))
    for tag, value, kind in tags:
        rec.set_tag(tag, value, value_type=kind)
    return rec


def _mm(mm: str, ml: list[int], old: bool = False):
    return [("Mm" if old else "MM", mm, "Z"), ("Ml" if old else "ML", array.array("B", ml), None)]


def reads(header):
    seq = REF[:20]
    r9 = seq[:7] + "T" + seq[8:]
    return [
        # forward, '?': C2 m (200), C7 canonical, C11 h; C16 not listed (no call)
        _record(header, "r1", 0, 0, "20M", seq, _mm("C+h?,0,0,0;C+m?,0,0,0;", [10, 10, 200, 200, 10, 10])),
        # forward, deletion of C2, '.': C7 m (230), C11 and C16 implicit canonical
        _record(header, "r2", 0, 0, "2M1D17M", seq[:2] + seq[3:], _mm("C+m.,0;", [230])),
        # reverse: read-as-sequenced Cs are ref G12, G8, G3: m (200), canonical (10), m (128)
        _record(header, "r3", 16, 0, "20M", seq, _mm("C+m?,0,0,0;", [200, 10, 128])),
        # forward duplex-style: C2 m (250); G-m on G3 m (250) and G8 canonical (5), counted on '-'
        _record(header, "r4", 0, 0, "20M", seq, _mm("C+m?,0;G-m?,0,0;", [250, 250, 5])),
        # old tags Mm/Ml, from ref 5: second C (C11) m (220)
        _record(header, "r5", 0, 5, "15M", REF[5:20], _mm("C+m?,1;", [220], old=True)),
        # soft clip and insertion: calls on the clipped CC and the inserted C are dropped; C7, C11 m
        _record(header, "r6", 0, 6, "2S3M1I4M", "CC" + REF[6:9] + "C" + REF[9:13],
                _mm("C+m?,0,0,0,0,0;", [250] * 5)),
        # C7 read as T (a difference); C2 canonical (10)
        _record(header, "r9", 0, 0, "20M", r9, _mm("C+m?,0;", [10])),
        # secondary and unmapped records are not counted
        _record(header, "r7", 256, 0, "20M", seq, _mm("C+m?,0,0,0;", [255, 255, 255])),
        _record(header, "r8", 4, -1, None, seq, _mm("C+m?,0,0,0;", [255, 255, 255])),
    ]


def main() -> None:
    (HERE / "small.fa").write_text(f">ctg1\n{REF}\n")
    pysam.faidx(str(HERE / "small.fa"))
    header = pysam.AlignmentHeader.from_dict({"HD": {"VN": "1.6", "SO": "coordinate"},
                                              "SQ": [{"SN": "ctg1", "LN": len(REF)}]})
    records = sorted(reads(header), key=lambda r: (r.reference_id < 0, r.reference_start))
    with pysam.AlignmentFile(str(HERE / "small.bam"), "wb", header=header) as out:
        for rec in records:
            out.write(rec)
    pysam.index(str(HERE / "small.bam"))


if __name__ == "__main__":
    main()
