"""Ultra-long reads with the GPU: set aside to the end of the run, or written out with --skip-ultra."""

import pysam

from streamer.pipeline.batching import BatchLimits, UltraLong, plan_batches
from streamer.io.alignments import AlignmentFilter, iter_alignments, write_records
from streamer.io.fastx import load_basecalls
from streamer.io.index import open_index
from streamer.skips import Skip

from conftest import ECOLI


def _inputs(tmp_path):
    reads = tmp_path / "reads.fasta"
    reads.write_text((ECOLI / "reads.fasta").read_text())
    index = open_index(reads, [ECOLI / "fast5"])
    records = list(iter_alignments(ECOLI / "reads.bam", AlignmentFilter()))
    return records, load_basecalls(reads), index


def test_ultra_long_reads_come_last(tmp_path):
    records, basecalls, index = _inputs(tmp_path)
    lengths = {a.read_id: len(basecalls[a.read_id]) for a in records}
    threshold = sorted(lengths.values())[-3]  # the two longest reads are ultra-long
    batches = list(plan_batches(records, basecalls, index, BatchLimits(3, 10**9), ultra=UltraLong(threshold)))
    order = [p.aln.read_id for pending, _ in batches for p in pending]
    assert sorted(order) == sorted(a.read_id for a in records)  # nothing lost, nothing twice
    is_ultra = [lengths[r] > threshold for r in order]
    assert is_ultra == sorted(is_ultra) and sum(is_ultra) >= 2  # all ordinary reads first
    assert all(len(p) <= 3 for p, _ in batches)


def test_skip_ultra_lists_and_writes_them(tmp_path):
    records, basecalls, index = _inputs(tmp_path)
    longest = max(records, key=lambda a: len(basecalls[a.read_id]))
    ultra = UltraLong(len(basecalls[longest.read_id]) - 1, tmp_path / "ultra.bam")
    batches = list(plan_batches(records, basecalls, index, BatchLimits(), ultra=ultra))
    skipped = [s for _, sk in batches for s in sk]
    assert [(s.read_id, s.reason) for s in skipped] == [(longest.read_id, Skip.ULTRA_LONG)]
    assert "written to" in skipped[0].message() and str(ultra.skip_to) in skipped[0].message()
    assert ultra.skipped_ids == {longest.read_id}
    assert write_records(ECOLI / "reads.bam", ultra.skip_to, ultra.skipped_ids, AlignmentFilter()) == 1
    with pysam.AlignmentFile(ultra.skip_to) as bam:
        assert [r.query_name for r in bam] == [longest.read_id]
    planned = {q.aln.read_id for p, _ in batches for q in p}
    assert longest.read_id not in planned and len(planned) == len({a.read_id for a in records}) - 1
