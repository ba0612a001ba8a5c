"""meth-freq: f5c's per-site frequencies, from call TSVs and from call records."""

import numpy as np
import pytest
from conftest import ECOLI, SHARED, needs_shared

from streamer.errors import InputError
from streamer_plugins.cpg.calls import CALLS_HEADER, MethCalls
from streamer_plugins.texts import Texts
from streamer_plugins.outputs.calls_tsv import read_calls, read_calls_file
from streamer_plugins.outputs.methfreq import MethFreq
from streamer_plugins.outputs.sinks import MethFreqTable

EXPECTED = SHARED / "expected" / "f5c-1.1"


def table(freq: MethFreq) -> dict[tuple[str, str, str], list[str]]:
    lines = freq.format().splitlines()
    return {tuple(f[:3]): f[3:] for f in (line.split("\t") for line in lines[1:])}


def freq_of(calls, split_groups=False) -> MethFreq:
    """meth-freq of a calls TSV (a path, or its lines), as the sink counts rows read back."""
    sink = MethFreqTable(table=MethFreq(split_groups=split_groups))
    for block in read_calls_file(calls) if hasattr(calls, "open") else read_calls(calls, "calls.tsv"):
        sink.on_batch(block)
    return sink.table


def call_row(chrom, start, end, llr, n, seq, strand="+", read="r1"):
    return f"{chrom}\t{strand}\t{start}\t{end}\t{read}\t{llr}\t-100.00\t-100.00\t1\t{n}\t{seq}\n"


@needs_shared
@pytest.mark.parametrize("split, expected", [(False, "freq.tsv"), (True, "freq-split.tsv")])
def test_matches_f5c_on_the_2kb_region(split, expected):
    got = freq_of(EXPECTED / "meth.tsv", split_groups=split).format().splitlines()
    want = (EXPECTED / expected).read_text().splitlines()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == w


def test_fixture_sites_worked_by_hand():
    # Four reads call 522759-522769 (3 CpGs): -2.51, +2.89, -2.10, -9.43. Three pass |llr| >= 2.5,
    # one of them methylated: 9 called sites, 3 methylated.
    # 522527-522533 (2 CpGs): -3.25, +2.23, -4.58, -4.40 -> 6 called, none methylated.
    # 522958 (1 CpG): +2.67, -0.63, -6.94, -0.82 -> 2 called, 1 methylated.
    t = table(freq_of(ECOLI / "meth.f5c-1.1.tsv"))
    chrom = "NC_000913.3"
    assert t[(chrom, "522759", "522769")] == ["3", "9", "3", "0.333", "GCTGTCGCTTTTCGGCGGCTG"]
    assert t[(chrom, "522527", "522533")] == ["2", "6", "0", "0.000", "GAATGCGTCAGCGTCAT"]
    assert t[(chrom, "522958", "522958")] == ["1", "2", "1", "0.500", "TGAATCGGTGG"]


def test_fixture_split_groups_by_hand():
    # GCTGTCGCTTTTCGGCGGCTG has CG at offsets 5, 12 and 15: the group's CpGs are at
    # 522759, 522766 and 522769, each credited with the group's three counted calls.
    t = table(freq_of(ECOLI / "meth.f5c-1.1.tsv", split_groups=True))
    for pos in ("522759", "522766", "522769"):
        assert t[("NC_000913.3", pos, pos)] == ["1", "3", "1", "0.333", "split-group"]
    assert t[("NC_000913.3", "522958", "522958")] == ["1", "2", "1", "0.500", "TGAATCGGTGG"]


def test_fixture_totals_follow_the_threshold():
    rows = [line.split("\t") for line in (ECOLI / "meth.f5c-1.1.tsv").read_text().splitlines()[1:]]
    counted = [r for r in rows if abs(float(r[5])) >= 2.5]
    for split in (False, True):
        sites = freq_of(ECOLI / "meth.f5c-1.1.tsv", split_groups=split).sites.values()
        assert sum(s.called_sites for s in sites) == sum(int(r[9]) for r in counted)
        assert sum(s.called_sites_methylated for s in sites) == sum(int(r[9]) for r in counted if float(r[5]) > 0)


def test_threshold_is_inclusive_and_ordering_is_bytewise():
    freq = freq_of(
        [
            CALLS_HEADER,
            call_row("chr2", 100, 100, "2.50", 1, "AAAACGAAAAA"),
            call_row("chr2", 100, 100, "-2.49", 1, "AAAACGAAAAA"),
            call_row("chr10", 7, 9, "-2.50", 2, "AAAACGCGAAAAA"),
            call_row("chr2", 50, 60, "3.00", 2, "X"),
            call_row("chr2", 50, 55, "4.00", 2, "Y"),
        ]
    )
    assert freq.format().splitlines()[1:] == [
        "chr10\t7\t9\t2\t2\t0\t0.000\tAAAACGCGAAAAA",
        "chr2\t50\t55\t2\t2\t2\t1.000\tY",
        "chr2\t50\t60\t2\t2\t2\t1.000\tX",
        "chr2\t100\t100\t1\t1\t1\t1.000\tAAAACGAAAAA",
    ]


def test_threshold_argument_and_split_offsets():
    freq = MethFreq(call_threshold=5.0, split_groups=True)
    freq.add("c", 20, 26, 4.99, 2, "AACGTTTTTCGAA")  # below 5.0: ignored
    freq.add("c", 20, 29, 5.0, 3, "ACGCGTTTTTCGA")  # CG at 1, 3, 10 -> 20, 22, 29
    freq.add("c", 22, 22, -6.0, 1, "TTCCGAA")  # a one-CpG call joins that site; first sequence stays
    assert freq.format().splitlines()[1:] == [
        "c\t20\t20\t1\t1\t1\t1.000\tsplit-group",
        "c\t22\t22\t1\t2\t1\t0.500\tsplit-group",
        "c\t29\t29\t1\t1\t1\t1.000\tsplit-group",
    ]


def test_incremental_records_use_the_printed_ratio():
    calls = MethCalls(
        read=np.array([0, 1]),
        start=np.array([10, 10]),
        end=np.array([10, 10]),
        strand=np.array([1, -1], np.int8),
        llr=np.array([2.496, -2.4949]),  # printed as 2.50 (counts) and -2.49 (does not)
        ll_meth=np.zeros(2),
        ll_unmeth=np.zeros(2),
        num_motifs=np.array([1, 1], np.int32),
        sequence=Texts.of(["AAAACGAAAAA"] * 2),
    )
    freq = MethFreq()
    freq.add_calls(calls, ["chrA", "chrA"])
    assert freq.format().splitlines()[1:] == ["chrA\t10\t10\t1\t1\t1\t1.000\tAAAACGAAAAA"]
    freq.add("chrA", 10, 10, -3.0, 1, "AAAACGAAAAA")
    assert freq.format().splitlines()[1:] == ["chrA\t10\t10\t1\t2\t1\t0.500\tAAAACGAAAAA"]


def test_old_header_names_the_group_column_after_it():
    header = (
        "chromosome\tstart\tend\tread_name\tlog_lik_ratio\tlog_lik_methylated\tlog_lik_unmethylated"
        "\tnum_calling_strands\tnum_cpgs\tsequence\n"
    )
    freq = freq_of([header, "c\t5\t5\tr\t-3.00\t-1\t-1\t1\t1\tACGT\n"])
    assert freq.format() == (
        "chromosome\tstart\tend\tnum_cpgs_in_group\tcalled_sites\tcalled_sites_methylated"
        "\tmethylated_frequency\tgroup_sequence\nc\t5\t5\t1\t1\t0\t0.000\tACGT\n"
    )


@pytest.mark.parametrize(
    "lines, line_no",
    [
        (["chromosome\tstart\n"], 1),
        ([CALLS_HEADER, "c\t+\t1\t2\tr\t1.0\n"], 2),
        ([CALLS_HEADER, call_row("c", -1, 2, "3.0", 1, "CG")], 2),
        ([CALLS_HEADER, call_row("c", 1, 2, "x", 1, "CG")], 2),
        ([CALLS_HEADER, call_row("c", 1, 2, "3.0", 1, "CG"), call_row("c", 1, 2, "3.0", 1, "CGé")], 3),
    ],
)
def test_malformed_input_names_the_line(lines, line_no):
    with pytest.raises(InputError) as err:
        freq_of(lines)
    assert err.value.line == line_no


def test_batch_counts_round_the_ratio_as_printed():
    """Ratios at the rounding edges (2.495 -> 2.5 counts, 0.005 -> 0.01 methylated, 0.125 -> 0.12): the
    compiled counts match Python's round(llr, 2) rule, for the tables and the publisher's changed keys."""
    edges = [2.495, np.nextafter(2.495, 0), 2.4949999, -2.495, np.nextafter(-2.495, 0), 0.005, -0.005, 0.125,
             -0.125, 2.5, -2.5, 5.0, np.nextafter(2.505, 3)]
    rng = np.random.default_rng(3)
    llr = np.array(edges + list(rng.uniform(-4, 4, 200)))
    n = len(llr)
    calls = MethCalls(np.zeros(n, np.int64), np.arange(n) * 10, np.arange(n) * 10, np.ones(n, np.int8), llr,
                      np.zeros(n), np.zeros(n), np.ones(n, np.int32), Texts.of(["AACGT"] * n))
    freq, changed = MethFreq(), set()
    freq.add_calls(calls, ["c"], changed)
    want = {("c", 10 * i, 10 * i): (1, int(round(x, 2) > 0))
            for i, x in enumerate(llr.tolist()) if abs(round(x, 2)) >= 2.5}
    assert {k: (s.called_sites, s.called_sites_methylated) for k, s in freq.sites.items()} == want
    assert changed == set(want) and freq.select(sorted(want)) == {k: freq.sites[k] for k in sorted(want)}


def test_site_index_counts_repeated_keys_across_growth():
    """Keys repeated across batches, on several contigs, with ends that differ only past the start (the
    index's third key part), through the index's rebuilds: each site's counts equal a plain count's."""
    rng = np.random.default_rng(7)
    freq, want = MethFreq(), {}
    for batch in range(6):
        n = 3000
        start = rng.integers(0, 5000, n) * 2
        end = start + rng.integers(0, 2, n)
        contig = rng.integers(0, 3, n)
        llr = np.full(n, 3.0)
        calls = MethCalls(contig, start, end, np.ones(n, np.int8), llr, np.zeros(n), np.zeros(n),
                          np.ones(n, np.int32), Texts.of(["ACG"] * n))
        freq.add_calls(calls, ["c0", "c1", "c2"])
        for c, s, e in zip(contig.tolist(), start.tolist(), end.tolist()):
            want[(f"c{c}", s, e)] = want.get((f"c{c}", s, e), 0) + 1
    assert {k: s.called_sites for k, s in freq.sites.items()} == want
    keys = sorted(want)[::97]
    assert [s.called_sites for s in freq.select(keys).values()] == [want[k] for k in keys]
