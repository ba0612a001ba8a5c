import gzip
import random
import threading

import numpy as np
import pytest

from streamer.errors import InputError
from streamer.io.alignments import AlignmentRecord, AlignmentFilter, iter_alignments
from streamer.io.fastx import iter_fastx, load_basecalls
from streamer.io.reference import Reference
from streamer.skips import Skip

from conftest import READ1


def test_fasta_plain_and_gzip(ecoli, tmp_path):
    plain = dict(iter_fastx(ecoli / "reads.fasta"))
    assert len(plain) == 8 and READ1 in plain
    gz = tmp_path / "reads.fa.gz"
    gz.write_bytes(gzip.compress((ecoli / "reads.fasta").read_bytes()))
    assert dict(iter_fastx(gz)) == plain


def test_fastq_and_wanted_subset(tmp_path):
    fq = tmp_path / "r.fastq.gz"
    with gzip.open(fq, "wt") as fh:
        fh.write("@r1 runid=x\nACGTacgt\n+\nIIIIIIII\n@r2\nGGGG\n+\nIIII\n")
    assert load_basecalls(fq) == {"r1": "ACGTACGT", "r2": "GGGG"}
    assert load_basecalls(fq, wanted={"r2"}) == {"r2": "GGGG"}


def test_unreadable_basecalls_name_the_file(tmp_path):
    bad = tmp_path / "bad.fastq.gz"
    bad.write_bytes(gzip.compress(b"@r1\nACGT\n+\nIIII\n")[:-10])
    with pytest.raises(InputError, match="bad.fastq.gz"):
        list(iter_fastx(bad))


def test_reference_from_plain_gzip_and_from_faidx(reference_path, tmp_path):
    ref = Reference(reference_path)
    assert ref.names == ["NC_000913.3"] and ref.length("NC_000913.3") == 4641652
    window = ref.fetch("NC_000913.3", 521678, 521700)
    plain = tmp_path / "ref.fa"
    plain.write_bytes(gzip.decompress(reference_path.read_bytes()))
    with Reference(plain) as indexed:
        assert indexed.fetch("NC_000913.3", 521678, 521700) == window
    with pytest.raises(InputError, match="not in the reference"):
        ref.fetch("chrX", 0, 10)
    with pytest.raises(InputError, match="not found"):
        Reference(tmp_path / "missing.fa")


def test_spans_read_in_windows_are_what_fetch_gives(reference_path, tmp_path):
    """A batch's spans are read a few windows at a time: each span's bases as its own fetch gives them,
    overlapping, far apart (a window each), past the contig's end, through faidx and held in memory."""
    plain = tmp_path / "ref.fa"
    plain.write_bytes(gzip.decompress(reference_path.read_bytes()))
    n = 4641652
    starts = np.array([521678, 900, 521600, 3_000_000, n - 5, n, 10], np.int64)
    ends = np.array([521990, 1400, 521700, 3_000_050, n + 1, n + 1, 10], np.int64)
    for ref in (Reference(reference_path), Reference(plain)):
        for gap in (0, 100, 1 << 30):
            spans = ref.spans("NC_000913.3", starts, ends, gap=gap)
            got = [spans.text[a : a + k].tobytes().decode() for a, k in zip(spans.at, spans.length)]
            assert got == [ref.fetch("NC_000913.3", int(a), int(b)) for a, b in zip(starts, ends)]
        assert len(ref.spans("NC_000913.3", starts[:0], ends[:0]).at) == 0
        with pytest.raises(InputError, match="not in the reference"):
            ref.spans("chrX", starts, ends)
        ref.close()


def test_one_indexed_reference_read_from_several_threads_at_once(reference_path, tmp_path):
    """The daemon's runs share one `Reference` and assemble their batches on their own threads: each
    fetch must give its own span though htslib's faidx handle is not safe to share between threads."""
    whole = Reference(reference_path).fetch("NC_000913.3", 0, 4641652)
    plain = tmp_path / "ref.fa"
    plain.write_bytes(gzip.decompress(reference_path.read_bytes()))
    wrong: list[object] = []
    with Reference(plain) as ref:

        def fetch(seed: int) -> None:
            rnd = random.Random(seed)
            for _ in range(1500):
                start = rnd.randrange(len(whole) - 20_000)
                end = start + rnd.randrange(1_000, 15_000)
                try:
                    if ref.fetch("NC_000913.3", start, end) != whole[start:end]:
                        wrong.append((start, end))
                except Exception as exc:  # noqa: BLE001 - a read of the shared handle that failed outright
                    wrong.append(exc)

        threads = [threading.Thread(target=fetch, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not wrong, f"{len(wrong)} of 6000 fetches gave other bases: {wrong[:3]}"


def test_alignment_filter_like_f5c(ecoli):
    recs = list(iter_alignments(ecoli / "reads.bam", AlignmentFilter()))
    assert len(recs) == 9  # 8 reads; one with a supplementary record far from its primary
    assert all(isinstance(a, AlignmentRecord) for a in recs)
    fwd = next(a for a in recs if a.read_id == READ1)
    assert (fwd.ref_name, fwd.ref_start, fwd.rc) == ("NC_000913.3", 521678, False)
    assert fwd.cigar.shape[1] == 2 and fwd.ref_end > fwd.ref_start
    strict = list(iter_alignments(ecoli / "reads.bam", AlignmentFilter(min_mapq=61)))
    assert {s.reason for s in strict} == {Skip.LOW_MAPQ}
    assert "reads.bam: mapping quality 60 < 61" in strict[0].message()


def test_corrupt_bam_names_the_file(tmp_path):
    bad = tmp_path / "bad.bam"
    bad.write_bytes(b"not a bam at all")
    with pytest.raises(InputError, match="bad.bam"):
        list(iter_alignments(bad, AlignmentFilter()))
