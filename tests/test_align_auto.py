"""`alignment.engine: auto`: the decision (pure), the agreement it rests on, and the edge that finds the
GPU, runs the check once per FM-index and keeps it beside the index."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pysam
import pytest

import streamer.daemon.aligner as edge
from conftest import REFERENCE
from streamer.align.agreement import (MIN_AGREEMENT, Agreement, EngineChoice, agreement, asked_for, check_reads,
                                      check_windows, choose_engine)
from streamer.align.engine import SeedAligner
from streamer.align.records import Hit, hit_arrays, sam_records
from streamer.daemon.aligner import ReadAligner, check_path, open_aligner
from streamer.io.alignments import AlignmentFilter

HEADER = pysam.AlignmentHeader.from_references(["a", "b"], [100_000, 50_000])


def _recs(*hits: tuple) -> list[pysam.AlignedSegment]:
    """A read's records from (contig, start, end, strand, mapq) hits, the first the primary."""
    return sam_records(HEADER, [("r", "A" * 1000)], [hit_arrays(HEADER, [
        Hit(ctg, st, en, 0, 1000, strand, mapq, True, [(en - st, 0)], 0) for ctg, st, en, strand, mapq in hits])])[0]


def test_the_decision():
    assert choose_engine("no GPU on this host", None) == EngineChoice("auto", "mappy", "no GPU on this host")
    passed, failed = Agreement(300, 296, 294), Agreement(300, 296, 290)
    assert passed.passed and not failed.passed and not Agreement(300, 0, 0).passed
    gpu = choose_engine("", passed)
    assert (gpu.engine, gpu.check) == ("gpu", passed)
    assert gpu.line() == "alignment engine auto: gpu (the gpu engine agreed with mappy on 294 of 296 reads mapped " \
                         "at MAPQ >= 20, 99.3%)"
    mappy = choose_engine("", failed)
    assert mappy.engine == "mappy" and mappy.why.endswith(f"under {MIN_AGREEMENT:.0%}")
    assert choose_engine("", None).engine == "mappy"
    assert choose_engine("no GPU package: none installed", passed).engine == "mappy"
    assert asked_for("cpu") == EngineChoice("cpu", "cpu", "as asked")
    assert gpu.as_dict() == {"asked": "auto", "engine": "gpu", "why": gpu.why, "passed": True,
                             "check": {"reads": 300, "compared": 296, "agreed": 294}}


def test_agreement_by_the_issues_criterion():
    mappy = [_recs(("a", 1000, 2000, 1, 60)), _recs(("a", 1000, 2000, 1, 60)), _recs(("a", 1000, 2000, 1, 60)),
             _recs(("a", 1000, 2000, -1, 60)), _recs(("a", 1000, 2000, 1, 19)), [], _recs(("a", 1000, 2000, 1, 20))]
    engine = [_recs(("a", 1050, 2050, 1, 60)),  # 95% overlap: agrees
              _recs(("a", 1150, 2150, 1, 60)),  # 85%: does not
              _recs(("b", 1000, 2000, 1, 60)),  # another contig
              _recs(("a", 1000, 2000, 1, 60)),  # another strand
              _recs(("a", 1000, 2000, 1, 60)),  # mappy's MAPQ under 20: not compared
              _recs(("a", 1000, 2000, 1, 60)),  # mappy unmapped: not compared
              []]  # the engine unmapped: compared, not agreed
    assert agreement(mappy, engine) == Agreement(reads=7, compared=5, agreed=1)
    # the primary is compared, whatever comes after it
    assert agreement([_recs(("a", 0, 1000, 1, 60))], [_recs(("a", 0, 1000, 1, 3), ("b", 0, 1000, 1, 60))]) == \
        Agreement(1, 1, 1)
    with pytest.raises(ValueError):
        agreement([[]], [])


def test_check_reads_come_from_windows_over_the_whole_reference():
    names = ["big", "tiny", "mid"]
    genome = np.random.default_rng(2).integers(0, 4, 1_000_000 + 300 + 400_000).astype(np.uint8)
    offsets = np.array([0, 1_000_000, 1_000_300, 1_400_300])
    windows = check_windows(names, genome, offsets, count=7, size=250_000)
    # steps of 1,400,300 / 7: the sixth falls in "tiny", too short for a read
    assert [w for w, _ in windows] == ["big:0", "big:200042", "big:400085", "big:600128", "big:800171", "mid:199957"]
    assert all(np.shares_memory(codes, genome) for _, codes in windows)  # views: no copy of a genome
    assert [len(codes) for _, codes in windows] == [250_000] * 4 + [199_829, 200_043]  # cut at their contig's end
    assert np.array_equal(windows[-1][1], genome[1_200_257:])
    assert check_windows(names, genome[:0], np.zeros(4, np.int64)) == []
    reads = check_reads(names, genome, offsets, n=20)
    assert reads == check_reads(names, genome, offsets, n=20)  # the same for the same reference
    assert len(reads) == 20 and all(len(seq) >= 500 and set(seq) <= set("ACGT") for _, seq in reads)


def test_auto_without_a_gpu_is_mappy_in_one_line(tmp_path, caplog):
    ref = tmp_path / REFERENCE.name
    ref.write_bytes(REFERENCE.read_bytes())
    no_gpu = edge.why_no_gpu()
    with caplog.at_level(logging.INFO, logger="streamer.daemon.aligner"):
        aligner = open_aligner("auto", ref, AlignmentFilter(), threads=1)
    if not no_gpu:  # a GPU host: the gpu engine was checked against mappy
        assert aligner.choice.check is not None and check_path(ref).is_file()
        return
    assert isinstance(aligner, ReadAligner) and aligner.choice == EngineChoice("auto", "mappy", no_gpu)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("alignment engine")]
    assert lines == [f"alignment engine auto: mappy ({no_gpu})"]
    assert not check_path(ref).exists() and not ref.with_name(ref.name + ".fmi").exists()  # nothing built for gpu
    assert open_aligner("mappy", ref, AlignmentFilter(), threads=1).choice == asked_for("mappy")


def test_the_check_runs_once_per_index_and_is_kept_beside_it(tmp_path, monkeypatch, caplog):
    """A GPU host, as far as `auto` can tell: the gpu engine seeds on the CPU here, the same seeds."""
    monkeypatch.setattr(edge, "why_no_gpu", lambda: "")
    ref = tmp_path / REFERENCE.name
    ref.write_bytes(REFERENCE.read_bytes())
    first = open_aligner("auto", ref, AlignmentFilter(), threads=2)
    assert isinstance(first, SeedAligner) and first.choice.engine == "gpu"
    check = first.choice.check
    assert check.reads == 300 and check.compared >= 290 and check.passed
    kept = json.loads(check_path(ref).read_text())
    assert check_path(ref).name == "ecoli_k12_mg1655.fa.gz.fmi.check.json"
    assert kept["result"] == {"reads": 300, "compared": check.compared, "agreed": check.agreed}

    class NoMappy(ReadAligner):
        def __init__(self, *args, **kwargs):
            raise AssertionError("the kept check needs no minimap2 index")

    with monkeypatch.context() as m:
        m.setattr(edge, "ReadAligner", NoMappy)
        with caplog.at_level(logging.INFO, logger="streamer.daemon.aligner"):
            again = open_aligner("auto", ref, AlignmentFilter(), threads=2)
    assert isinstance(again, SeedAligner) and again.choice == first.choice
    assert f"checked before, as kept in {check_path(ref)}" in caplog.text
    # a kept failure: mappy, and no gpu engine started for it
    failed = {"reads": 300, "compared": 100, "agreed": 90}
    check_path(ref).write_text(json.dumps({"key": kept["key"], "result": failed}))
    with monkeypatch.context() as m:
        m.setattr(edge, "fm_aligner", lambda *a, **k: pytest.fail("a kept failure needs no gpu engine"))
        fell_back = open_aligner("auto", ref, AlignmentFilter(), threads=2)
    assert isinstance(fell_back, ReadAligner) and fell_back.choice == choose_engine("", Agreement(**failed))
    # the reference touched (a fresh clone): the same content, the index and the kept result still hold
    fmi = ref.with_name(ref.name + ".fmi")
    built = fmi.stat().st_mtime_ns
    os.utime(ref, ns=(ref.stat().st_mtime_ns + 10**9,) * 2)
    with caplog.at_level(logging.INFO, logger="streamer.daemon.aligner"):
        caplog.clear()
        open_aligner("auto", ref, AlignmentFilter(), threads=2)
    assert "checked before" in caplog.text and fmi.stat().st_mtime_ns == built
    # a result kept for another index: checked again
    other = {**kept["key"], "index": {**kept["key"]["index"], "blake2b": "0" * 32}}
    check_path(ref).write_text(json.dumps({"key": other, "result": failed}))
    checked = open_aligner("auto", ref, AlignmentFilter(), threads=2)
    assert checked.choice == first.choice
    assert json.loads(check_path(ref).read_text())["key"] == kept["key"]
