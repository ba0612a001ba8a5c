"""The daemon aligns FASTQ basecalls with the engine `alignment.engine` names: streamer's own gives the
rows the run's BAM gives; `auto` (the default) is mappy where there is no GPU, and summary.json says so."""

from __future__ import annotations

from streamer.daemon.aligner import open_aligner, why_no_gpu
from streamer.daemon.shell import Daemon
from streamer.io.alignments import AlignmentFilter

from daemon_support import FakePipeline, no_leaks, rows  # noqa: F401
from test_align_command import brute_force_engine  # noqa: F401
from test_daemon import make_config, reference, replay, run_to_end, source, summary  # noqa: F401


def _bam_and_fastq_runs(source, reference, reference_copy, tmp_path, **keys):
    """The run with its BAM, then the same run's FASTQ alone through the daemon's aligner: both configs and
    the aligners the second opened."""
    replay(source, tmp_path / "with_bam")
    bam_cfg = make_config(tmp_path, reference_copy, **{"watch.dir": tmp_path / "with_bam",
                                                       "output.dir": tmp_path / "out_bam"})
    run_to_end(bam_cfg, FakePipeline(), reference)
    replay(source, tmp_path / "live", bam=False)
    cfg = make_config(tmp_path, reference_copy, **keys)
    made = []

    def make_aligner():
        made.append(open_aligner(cfg.alignment.engine, cfg.reference.genome, AlignmentFilter(), threads=2))
        return made[-1]

    d = Daemon(cfg, FakePipeline(), reference, make_aligner=make_aligner)
    try:
        assert d.run() == 0
    finally:
        d.close()
    return bam_cfg, cfg, made


def test_fastq_without_bam_is_aligned_by_the_configured_engine(source, reference, reference_copy, tmp_path,
                                                               brute_force_engine, no_leaks):
    bam_cfg, cfg, made = _bam_and_fastq_runs(source, reference, reference_copy, tmp_path,
                                             **{"alignment.engine": "cpu"})
    assert type(made[0]).__name__ == "SeedAligner"
    assert summary(cfg)["alignment_engine"]["why"] == "as asked"
    assert rows(cfg.output.dir / "meth.tsv") == rows(bam_cfg.output.dir / "meth.tsv")


def test_auto_engine_in_the_daemon(source, reference, reference_copy, tmp_path, no_leaks):
    """The default `alignment.engine`, auto: mappy where there is no GPU, said in summary.json, with the rows
    the run's BAM gives."""
    bam_cfg, cfg, made = _bam_and_fastq_runs(source, reference, reference_copy, tmp_path)
    assert summary(bam_cfg)["alignment_engine"] is None  # the BAM's alignments: no aligner was needed
    assert cfg.alignment.engine == "auto"
    chosen = summary(cfg)["alignment_engine"]
    assert chosen == made[0].choice.as_dict() and chosen["asked"] == "auto"
    if why_no_gpu():  # this host
        assert type(made[0]).__name__ == "ReadAligner" and chosen["engine"] == "mappy"
        assert chosen["why"] == why_no_gpu()
    assert rows(cfg.output.dir / "meth.tsv") == rows(bam_cfg.output.dir / "meth.tsv")
