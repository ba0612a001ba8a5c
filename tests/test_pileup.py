"""`streamer pileup`: modkit 0.4.4's own cases byte for byte, and hand-checked fixtures (tests/data/modbase)."""

from __future__ import annotations

import array
import importlib.metadata
import json
import random
import shutil
from pathlib import Path

import pysam
import pytest

from conftest import DATA
from streamer import registry
from streamer.cli import build_parser, main
from streamer_plugins.modbase.bedmethyl import Layout, expand, render
from streamer_plugins.modbase.caller import Thresholds
from streamer_plugins.modbase.pileup import CallOptions, PileupCounts, _Batch

@pytest.fixture(autouse=True)
def _entry_point(monkeypatch):
    """The command as pyproject.toml registers it, whether or not this checkout's metadata is installed."""
    ep = importlib.metadata.EntryPoint("pileup", "streamer_plugins.modbase.command", registry.COMMANDS)
    original = registry._group
    monkeypatch.setattr(registry, "_group", lambda group: {"pileup": ep} if group == registry.COMMANDS else original(group))


MODKIT = Path(__file__).resolve().parents[2] / "shared" / "data" / "modkit_pileup"
needs_modkit_cases = pytest.mark.skipif(not MODKIT.is_dir(), reason="../shared/data/modkit_pileup not present")
SMALL = DATA / "modbase"


def _cases():
    if not MODKIT.is_dir():
        return []
    cases = json.loads((MODKIT / "cases.json").read_text())["cases"]
    out = []
    for case in cases:
        for interval in case.get("interval_values", [None]):
            out.append(pytest.param(case, interval, id=f"{case['id']}-{interval}" if interval else case["id"]))
    return out


def _streamer_args(case: dict, interval: str | None, out: Path) -> list[str]:
    """modkit's command line with `modkit pileup IN OUT` rewritten as `streamer pileup IN -o OUT`."""
    folder = MODKIT / case["dir"]
    args = []
    for arg in case["modkit_args"][1:]:
        if arg == "{out}":
            continue
        args.append(arg.replace("{bam}", str(folder / case["bam"])).replace("{ref}", str(folder / (case["ref"] or "")))
                    .replace("{interval}", interval or ""))
    return ["pileup", *args, "-o", str(out)]


@needs_modkit_cases
@pytest.mark.parametrize("case,interval", _cases())
def test_modkit_cases_byte_for_byte(case, interval, tmp_path):
    out = tmp_path / "out.bed"
    assert main(_streamer_args(case, interval, out)) == 0
    assert out.read_bytes() == (MODKIT / case["dir"] / case["expected"]).read_bytes()


@needs_modkit_cases
def test_fixed_threshold_equals_the_estimated_one(tmp_path):
    case = json.loads((MODKIT / "cases.json").read_text())["cases"][1]
    folder = MODKIT / case["dir"]
    out = tmp_path / "out.bed"
    assert main(["pileup", str(folder / case["bam"]), "--filter-threshold", "C:0.662109375", "--only-tabs", "-o", str(out)]) == 0
    assert out.read_bytes() == (folder / case["expected"]).read_bytes()


def _run(tmp_path, *args, bam=SMALL / "small.bam") -> list[list[str]]:
    out = tmp_path / "out.bed"
    assert main(["pileup", str(bam), "-o", str(out), *args]) == 0
    return [line.split("\t") for line in out.read_text().splitlines()]


def _row(rows, pos, strand, code):
    hits = [r for r in rows if r[1] == str(pos) and r[5] == strand and r[3] == code]
    assert len(hits) == 1, (pos, strand, code, rows)
    return hits[0][9:]


def test_forward_reverse_deletion_modes_old_tags_duplex(tmp_path):
    rows = _run(tmp_path, "--no-filtering")
    # rows only where a read has a call: C2, C7, C11 and C16 on '+', G3, G8, G12 on '-'
    assert sorted({(int(r[1]), r[5]) for r in rows}) == [(2, "+"), (3, "-"), (7, "+"), (8, "-"), (11, "+"), (12, "-"), (16, "+")]
    # C2: r1 m, r4 m, r9 canonical; r2 deletes it. h is declared (by r1) so it has a row too.
    assert _row(rows, 2, "+", "m") == ["3", "66.67", "2", "1", "0", "1", "0", "0", "0"]
    assert _row(rows, 2, "+", "h") == ["3", "0.00", "0", "1", "2", "1", "0", "0", "0"]
    # C7: r1 canonical, r2 m ('.' mode, explicit), r6 m; r9 reads T (diff); r4, r5 skip it under '?'
    assert _row(rows, 7, "+", "m") == ["3", "66.67", "2", "1", "0", "0", "0", "1", "2"]
    # C11: r1 h, r2 implicit canonical, r5 m (old Mm/Ml tags), r6 m; r4 and r9 no call
    assert _row(rows, 11, "+", "m") == ["4", "50.00", "2", "1", "1", "0", "0", "0", "2"]
    assert _row(rows, 11, "+", "h") == ["4", "25.00", "1", "1", "2", "0", "0", "0", "2"]
    # C16: only r2's implicit canonical call; four reads cover it without a call
    assert _row(rows, 16, "+", "m") == ["1", "0.00", "0", "1", "0", "0", "0", "0", "4"]
    # '-' rows: the reverse read r3 and r4's G-m calls; only m is declared on this strand
    assert _row(rows, 3, "-", "m") == ["2", "100.00", "2", "0", "0", "0", "0", "0", "0"]
    assert _row(rows, 8, "-", "m") == ["2", "0.00", "0", "2", "0", "0", "0", "0", "0"]
    assert _row(rows, 12, "-", "m") == ["1", "100.00", "1", "0", "0", "0", "0", "0", "0"]
    assert not [r for r in rows if r[5] == "-" and r[3] == "h"]


def test_fixed_threshold_counts_failed_calls(tmp_path):
    rows = _run(tmp_path, "--filter-threshold", "0.8")
    # C2 at 0.8: r1 (m 0.783, canonical 0.176) fails, r4 m 0.979 and r9 canonical 0.959 pass
    assert _row(rows, 2, "+", "m") == ["2", "50.00", "1", "1", "0", "1", "1", "0", "0"]
    assert _row(rows, 2, "+", "h") == ["2", "0.00", "0", "1", "1", "1", "1", "0", "0"]


def test_cpg_and_combined_strands(tmp_path):
    ref = str(SMALL / "small.fa")
    rows = _run(tmp_path, "--no-filtering", "--cpg", "--ref", ref)
    assert sorted({int(r[1]) for r in rows}) == [2, 3, 7, 8, 11, 12]  # the lone C16 is not a CpG
    combined = _run(tmp_path, "--no-filtering", "--cpg", "--ref", ref, "--combine-strands")
    assert sorted({(int(r[1]), r[5]) for r in combined}) == [(2, "."), (7, "."), (11, ".")]
    # CpG 2-3: '+' m (3 valid, 2 mod, 1 canonical, 1 deletion) plus '-' m (2 valid, 2 mod)
    assert _row(combined, 2, ".", "m") == ["5", "80.00", "4", "1", "0", "1", "0", "0", "0"]
    assert _row(combined, 2, ".", "h") == ["3", "0.00", "0", "1", "2", "1", "0", "0", "0"]


def test_several_motifs_name_their_rows(tmp_path):
    rows = _run(tmp_path, "--no-filtering", "--motif", "CG", "0", "--motif", "C", "0", "--ref", str(SMALL / "small.fa"))
    names = {r[3] for r in rows if r[1] == "2" and r[5] == "+"}
    assert names == {"h,CG,0", "m,CG,0", "h,C,0", "m,C,0"}
    assert {r[3] for r in rows if r[1] == "16"} == {"h,C,0", "m,C,0"}


def test_region_combine_mods_and_ignore(tmp_path):
    rows = _run(tmp_path, "--no-filtering", "--region", "ctg1:5-12")
    assert sorted({int(r[1]) for r in rows}) == [7, 8, 11]
    combined = _run(tmp_path, "--no-filtering", "--combine-mods")
    # C11: h (r1) and m (r5, r6) together, one row named by the primary base
    assert _row(combined, 11, "+", "C") == ["4", "75.00", "3", "1", "0", "0", "0", "0", "2"]
    ignored = _run(tmp_path, "--no-filtering", "--ignore", "h")
    assert not [r for r in ignored if r[3] == "h"]
    # r1 at C11 (h 0.783, m 0.041): half of h goes to m (0.433), half to canonical (0.568)
    assert _row(ignored, 11, "+", "m") == ["4", "50.00", "2", "2", "0", "0", "0", "0", "2"]


def test_equal_mod_probabilities_resolve_as_modkit(tmp_path):
    header = pysam.AlignmentHeader.from_dict({"SQ": [{"SN": "c", "LN": 10}]})
    rec = _aligned(header, "tie", "ACGTACGTAC", "C+h?,0;C+m?,0;", [120, 120])
    # h and m both 0.471 > canonical 0.059: modkit's map yields h then m, and the last maximum wins
    rows = _run(tmp_path, "--no-filtering", bam=_bam(tmp_path / "tie.bam", header, [rec]))
    assert _row(rows, 1, "+", "m")[:3] == ["1", "100.00", "1"]


def test_batches_and_order_do_not_change_counts():
    with pysam.AlignmentFile(str(SMALL / "small.bam")) as bam:
        contigs = list(zip(bam.references, bam.lengths))
        records = [(r, "small.bam") for r in bam.fetch(until_eof=True)]
    options = CallOptions(Thresholds())

    def text(batches):
        counts = PileupCounts(contigs, options)
        for batch in batches:
            counts.add(batch)
        return render(expand(counts.rows(), counts, Layout()), counts, Layout())

    shuffled = records[:]
    random.Random(1).shuffle(shuffled)
    whole = text([records])
    assert whole and text([shuffled[:3], shuffled[3:5], shuffled[5:]]) == whole


def test_several_inputs_add_up(tmp_path):
    copy = tmp_path / "copy.bam"
    shutil.copy(SMALL / "small.bam", copy)
    shutil.copy(SMALL / "small.bam.bai", str(copy) + ".bai")
    out = tmp_path / "two.bed"
    assert main(["pileup", str(SMALL / "small.bam"), str(copy), "--no-filtering", "-o", str(out)]) == 0
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert _row(rows, 2, "+", "m") == ["6", "66.67", "4", "2", "0", "2", "0", "0", "0"]


def _aligned(header, name, seq, mm, ml, *, flag=0, pos=0, ml_tag="ML"):
    rec = pysam.AlignedSegment(header)
    rec.query_name, rec.flag, rec.reference_id, rec.reference_start = name, flag, 0, pos
    rec.mapping_quality, rec.cigarstring, rec.query_sequence = 60, f"{len(seq)}M", seq
    rec.set_tag("MM", mm, value_type="Z")
    rec.set_tag(ml_tag, array.array("B", ml))
    return rec


def _bam(path: Path, header, records) -> Path:
    with pysam.AlignmentFile(str(path), "wb", header=header) as out:
        for rec in records:
            out.write(rec)
    return path


def _warnings(capsys) -> list[str]:
    """The warning lines the command printed (nothing else on stderr is a warning)."""
    return [line for line in capsys.readouterr().err.splitlines() if "warning" in line.lower()]


def test_bad_tags_are_one_line_each_and_the_rest_counts(tmp_path, capsys):
    header = pysam.AlignmentHeader.from_dict({"SQ": [{"SN": "c", "LN": 10}]})
    seq = "ACGTACGTAC"  # Cs at 1, 5, 9
    bam = _bam(tmp_path / "bad.bam", header, [
        _aligned(header, "short_ml", seq, "C+m?,0,0;", [200]),
        _aligned(header, "past_end", seq, "C+m?,0,5;", [200, 200]),
        _aligned(header, "unknown_code", seq, "C+*?,0;", [200]),
        _aligned(header, "long_ml", seq, "C+m?,0;", [200, 7, 7]),
        _aligned(header, "good", seq, "C+m?,0,0;", [200, 10]),
    ])
    rows = _run(tmp_path, "--no-filtering", bam=bam)
    lines = _warnings(capsys)
    for name, why in (("short_ml", "ML has 1 values"), ("past_end", "past the end"), ("unknown_code", "unknown modification code"),
                      ("long_ml", "extra values are ignored")):
        hits = [m for m in lines if f"read {name}:" in m]
        assert len(hits) == 1 and str(bam) in hits[0] and why in hits[0], lines
    # the good read's calls count, and long_ml's (modkit ignores extra ML values); the three
    # bad reads cover C1 and C5 without calls
    assert _row(rows, 1, "+", "m") == ["2", "100.00", "2", "0", "0", "0", "0", "0", "3"]
    assert _row(rows, 5, "+", "m") == ["1", "0.00", "0", "1", "0", "0", "0", "0", "4"]


def test_truncated_bam_is_one_line_and_earlier_reads_count(tmp_path, capsys):
    header = pysam.AlignmentHeader.from_dict({"SQ": [{"SN": "c", "LN": 10}]})
    n = 20000
    path = _bam(tmp_path / "full.bam", header,
                [_aligned(header, f"read{i}", "ACGTACGTAC", "C+m?,0;", [200]) for i in range(n)])
    cut = tmp_path / "cut.bam"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    rows = _run(tmp_path, "--no-filtering", bam=cut)
    lines = _warnings(capsys)
    assert len(lines) == 1 and str(cut) in lines[0] and "after read read" in lines[0], lines
    counted = int(_row(rows, 1, "+", "m")[0])
    assert 0 < counted < n


def test_default_implicit_mode_is_refused_unless_forced(tmp_path):
    header = pysam.AlignmentHeader.from_dict({"SQ": [{"SN": "c", "LN": 10}]})
    bam = _bam(tmp_path / "implicit.bam", header, [_aligned(header, "r", "ACGTACGTAC", "C+m,0;", [200])])
    assert _run(tmp_path, "--no-filtering", bam=bam) == []
    rows = _run(tmp_path, "--no-filtering", "--force-allow-implicit", bam=bam)
    assert _row(rows, 5, "+", "m") == ["1", "0.00", "0", "1", "0", "0", "0", "0", "0"]


def test_command_comes_from_the_entry_point_group():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert "pileup" in sub.choices and "call" in sub.choices


def test_pyproject_registers_the_command():
    (entry,) = importlib.metadata.entry_points(group="streamer.commands", name="pileup")
    assert entry.value == "streamer_plugins.modbase.command"


def _random_reads(n: int, seed: int = 3):
    """Reads on a random 2 kb contig with deletions, insertions, both strands and dorado-style tags."""
    rng = random.Random(seed)
    ref = "".join(rng.choice("ACGT") for _ in range(2000))
    header = pysam.AlignmentHeader.from_dict({"SQ": [{"SN": "r", "LN": len(ref)}]})
    out = []
    for i in range(n):
        start = rng.randrange(0, 1500)
        a, b = rng.randrange(20, 200), rng.randrange(1, 5)
        seq = ref[start:start + a] + "ACG"[: rng.randrange(0, 3)] + ref[start + a + b:start + 400]
        ins = len(seq) - (400 - b)
        cigar = f"{a}M{ins}I{b}D{400 - a - b}M" if ins else f"{a}M{b}D{400 - a - b}M"
        rev = rng.random() < 0.5
        fwd = seq.translate(str.maketrans("ACGT", "TGCA"))[::-1] if rev else seq
        n_c = fwd.count("C")
        mode = rng.choice("?.")
        picked = sorted(rng.sample(range(n_c), min(n_c, 30)))
        deltas = ",".join(str(x - y - 1) for x, y in zip(picked, [-1] + picked[:-1]))
        h = [rng.randrange(0, 100) for _ in picked]
        m = [rng.randrange(0, 256 - x) for x in h]
        rec = pysam.AlignedSegment(header)
        rec.query_name, rec.flag, rec.reference_id, rec.reference_start = f"q{i}", 16 if rev else 0, 0, start
        rec.mapping_quality, rec.cigarstring, rec.query_sequence = 60, cigar, seq
        rec.set_tag("MM", f"C+h{mode},{deltas};C+m{mode},{deltas};", value_type="Z")
        rec.set_tag("ML", array.array("B", h + m))
        out.append((rec, "random"))
    return header, out


@pytest.mark.parametrize("thresholds", [Thresholds(), Thresholds(0.0, {1: 0.7}, {"h": 0.5})])
def test_numba_tag_path_equals_the_general_reader(thresholds):
    header, records = _random_reads(300)
    contigs = list(zip(header.references, header.lengths))
    fast = PileupCounts(contigs, CallOptions(thresholds))
    fast.add(records)
    general = PileupCounts(contigs, CallOptions(thresholds))
    for entry in fast.entries:  # the same column order, so the rows compare line by line
        general.entry(*entry)
    batch = _Batch()
    for rec, source in records:
        general._add_record(batch, rec, source)
    general._accumulate(batch.arrays())
    text = render(expand(fast.rows(), fast, Layout()), fast, Layout())
    assert text.count("\n") > 500
    assert text == render(expand(general.rows(), general, Layout()), general, Layout())


def test_percent_is_printed_from_the_exact_float32():
    from streamer_plugins.modbase.rowtext import render_text
    import numpy as np
    rng = np.random.default_rng(5)
    n = rng.integers(0, 1000, 5000)
    cov = n + rng.integers(1, 1000, 5000)
    pct = n.astype(np.float32) / cov.astype(np.float32) * np.float32(100)
    pct = np.concatenate([pct, np.array([0.125, 0.375, 12.5, 100.0, 0.005], np.float32)])
    k = len(pct)
    values = np.zeros((k, 8), np.int64)
    text = render_text(np.zeros(k, np.int64), np.arange(k), np.zeros(k, np.int64), np.zeros(k, np.int64),
                       values, pct, ["m"], ["c"], False)
    printed = [line.split("\t")[10] for line in text.splitlines()]
    assert printed == [f"{float(x):.2f}" for x in pct]
    assert printed[-5:-1] == ["0.12", "0.38", "12.50", "100.00"]


def test_unsorted_input_gives_the_same_file(tmp_path):
    with pysam.AlignmentFile(str(SMALL / "small.bam")) as bam:
        header = bam.header.to_dict()
        records = list(bam.fetch(until_eof=True))
    header["HD"]["SO"] = "unsorted"
    random.Random(2).shuffle(records)
    unsorted = _bam(tmp_path / "unsorted.bam", pysam.AlignmentHeader.from_dict(header),
                    [pysam.AlignedSegment.fromstring(r.to_string(), pysam.AlignmentHeader.from_dict(header)) for r in records])
    assert _run(tmp_path, "--no-filtering", bam=unsorted) == _run(tmp_path, "--no-filtering")


@pytest.mark.parametrize("include_unmapped", [False, True])
def test_threshold_sample_through_numba_equals_the_general_reader(tmp_path, include_unmapped):
    import numpy as np
    from streamer_plugins.modbase.caller import percentile
    from streamer_plugins.modbase.reader import BamInputs, Sampling, _read_values, estimate_thresholds
    header, records = _random_reads(200, seed=8)
    path = _bam(tmp_path / "random.bam", header, [r for r, _ in records])
    sampling = Sampling(percentile=0.3, include_unmapped=include_unmapped)
    estimated = estimate_thresholds(BamInputs([path]), sampling, None)
    values = np.concatenate([_read_values(r, sampling)[1] for r, _ in records])
    assert estimated.per_base == {1: percentile(values, 0.3)}


def test_touched_blocks_hold_every_changed_site():
    header, records = _random_reads(120, seed=4)
    counts = PileupCounts(list(zip(header.references, header.lengths)), CallOptions(Thresholds()))
    counts.add(records[:60])
    before = {tuple(r[:3]): tuple(r[3:]) for r in counts.rows().tolist()}
    counts.add(records[60:])
    after = {tuple(r[:3]): tuple(r[3:]) for r in counts.rows().tolist()}
    updates = {tuple(r[:3]): tuple(r[3:]) for r in counts.rows(counts.touched).tolist()}
    assert {k: v for k, v in after.items() if before.get(k) != v}.items() <= updates.items()
    assert len(counts.touched)


def test_chebi_codes_and_n_entries_go_through_the_general_reader(tmp_path):
    header = pysam.AlignmentHeader.from_dict({"SQ": [{"SN": "c", "LN": 10}]})
    seq = "ACGTACGTAC"
    bam = _bam(tmp_path / "chebi.bam", header, [
        # ChEBI 76792 (4mC) beside h at C1; rows: letter codes before ChEBI numbers
        _aligned(header, "chebi", seq, "C+h?,0;C+76792?,0;", [10, 240]),
        # an N entry counts every base: skip 1 lands on position 1, a C, called m
        _aligned(header, "n_entry", seq, "N+m?,1;", [250]),
    ])
    rows = _run(tmp_path, "--no-filtering", bam=bam)
    # both reads call C1 and declare their codes there: h and 76792 from one, m from the other
    assert [r[3] for r in rows if r[1] == "1"] == ["h", "m", "76792"]
    assert _row(rows, 1, "+", "76792")[:3] == ["2", "50.00", "1"]
    assert _row(rows, 1, "+", "m")[:3] == ["2", "50.00", "1"]


def test_single_base_motifs_follow_modkits_shortcut(tmp_path):
    # modkit: with several single-base motifs the C motif's sites (C on '+', G on '-') get both
    # strands and both motif ids, so every row is named once per motif
    rows = _run(tmp_path, "--no-filtering", "--motif", "C", "0", "--motif", "G", "0", "--ref", str(SMALL / "small.fa"))
    assert {r[3] for r in rows if r[1] == "2" and r[5] == "+"} == {"h,C,0", "m,C,0", "h,G,0", "m,G,0"}
    assert [r[3] for r in rows if r[1] == "3" and r[5] == "-"] == ["m,C,0", "m,G,0"]


def test_6ma_calls_beside_5mc(tmp_path):
    header = pysam.AlignmentHeader.from_dict({"SQ": [{"SN": "c", "LN": 10}]})
    seq = "ACGTACGTAC"  # As at 0, 4, 8; Ts at 3, 7
    fwd = _aligned(header, "fwd", seq, "C+m?,0;A+a?,0,0;", [250, 240, 3])
    rev = _aligned(header, "rev", seq, "A+a.,0;", [250], flag=16)  # read-as-sequenced As are the Ts 7, 3
    rows = _run(tmp_path, "--no-filtering", bam=_bam(tmp_path / "a.bam", header, [fwd, rev]))
    assert _row(rows, 0, "+", "a")[:4] == ["1", "100.00", "1", "0"]
    assert _row(rows, 4, "+", "a")[:4] == ["1", "0.00", "0", "1"]
    assert _row(rows, 1, "+", "m")[:3] == ["1", "100.00", "1"]
    # the reverse read: T7 called a, T3 implicit canonical ('.'), both on '-'
    assert _row(rows, 7, "-", "a")[:3] == ["1", "100.00", "1"]
    assert _row(rows, 3, "-", "a")[:4] == ["1", "0.00", "0", "1"]
