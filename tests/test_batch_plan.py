"""Batches planned from the BAM in file order: the first ones ramp up to B."""

from streamer.io.alignments import AlignmentFilter, iter_alignments
from streamer.io.fastx import load_basecalls
from streamer.io.index import open_index
from streamer.pipeline.batching import BatchLimits, plan_batches

from conftest import ECOLI


def test_the_first_batches_ramp_up_to_b_and_the_reads_keep_their_order(tmp_path):
    reads = tmp_path / "reads.fasta"
    reads.write_text((ECOLI / "reads.fasta").read_text())
    index, basecalls = open_index(reads, [ECOLI / "fast5"]), load_basecalls(reads)
    records = list(iter_alignments(ECOLI / "reads.bam", AlignmentFilter()))
    b = sum(len(basecalls[a.read_id]) for a in records) // 2
    limits = BatchLimits(max_reads=10**6, max_bases=b)

    def plan(ramp):
        return [[p.aln.read_id for p in pending] for pending, _ in plan_batches(records, basecalls, index, limits,
                                                                               ramp=ramp)]  # fmt: skip

    flat, ramped = plan(0), plan(2)
    assert sum(ramped, []) == sum(flat, [])  # the same reads in the same order, only cut elsewhere
    caps = [b // 4, b // 2] + [b] * (len(ramped) - 2)
    for ids, cap in zip(ramped[:-1], caps):  # each batch closed by the read that reached its cap
        bases = [len(basecalls[r]) for r in ids]
        assert sum(bases[:-1]) < cap <= sum(bases)
    assert len(ramped[0]) < len(flat[0])
