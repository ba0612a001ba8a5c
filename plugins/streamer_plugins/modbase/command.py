"""`streamer pileup`: modkit 0.4.4's `pileup` over dorado's MM/ML calls, same options, same bedMethyl.

`modkit pileup IN.bam OUT.bed [options]` becomes `streamer pileup IN.bam -o OUT.bed [options]`;
several BAMs (over the same contigs) are counted together. Registered through the
`streamer.commands` entry-point group, so the core never imports it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from streamer.errors import ConfigError, InputError
from streamer.flags import bounded
from streamer_plugins.modbase import tally
from streamer_plugins.modbase.bedmethyl import BedMethylWriter, Layout
from streamer_plugins.modbase.caller import Thresholds, normalise_code, parse_filter_thresholds, parse_mod_thresholds
from streamer_plugins.modbase.motifs import contig_sites, load_reference, parse_motifs
from streamer_plugins.modbase.pileup import CallOptions, PileupCounts
from streamer_plugins.modbase.reader import BamInputs, Sampling, estimate_thresholds, parse_region, record_batches

NAME = "pileup"
HELP = "per-site counts of modified-base calls (MM/ML tags) as bedMethyl, like modkit pileup"
HEADER = ("chrom\tchromStart\tchromEnd\tname\tscore\tstrand\tthickStart\tthickEnd\tcolor\tvalid_coverage\t"
          "percent_modified\tcount_modified\tcount_canonical\tcount_other_mod\tcount_delete\tcount_fail\t"
          "count_diff\tcount_nocall\n")
log = logging.getLogger("streamer.pileup")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bams", nargs="+", type=Path, metavar="BAM", help="aligned modBAM(s); sorted and indexed reads fastest")
    p.add_argument("-o", "--output", default="-", help="output bedMethyl ('-' or 'stdout': standard output) [-]")
    p.add_argument("--region", help="only CHROM or CHROM:START-END (0-based, end exclusive)")
    bounded(p, "-t", "--threads", type=int, minimum=1, default=4, help="accepted for modkit compatibility")
    bounded(p, "-i", "--interval-size", type=int, minimum=1, default=100_000, help="accepted for modkit compatibility (output unchanged)")
    bounded(p, "--sampling-interval-size", type=int, minimum=1, default=1_000_000, help=argparse.SUPPRESS)
    bounded(p, "--max-depth", type=int, minimum=1, default=8000, help="accepted for modkit compatibility; every read is counted")
    p.add_argument("--suppress-progress", action="store_true", help=argparse.SUPPRESS)
    f = p.add_argument_group("filtering (modkit's meanings)")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--no-filtering", action="store_true", help="no pass threshold: every call counts")
    bounded(g, "-p", "--filter-percentile", type=float, minimum=0, help="estimate the threshold as this quantile of call confidences [0.1]")
    g.add_argument("--filter-threshold", "--pass-threshold", action="append",
                   help="fixed threshold, global (0.8) or per base (C:0.7); repeatable")
    f.add_argument("--mod-thresholds", "--mod-threshold", action="append", help="threshold for one mod code (h:0.8); repeatable")
    s = f.add_mutually_exclusive_group()
    bounded(s, "-n", "--num-reads", type=int, minimum=1, help="reads sampled to estimate the threshold [10042]")
    bounded(s, "-f", "--sampling-frac", type=float, minimum=0, help="fraction of reads sampled to estimate the threshold")
    bounded(f, "--seed", type=int, minimum=0, help="random seed for -f")
    f.add_argument("--sample-region", help="region sampled for the threshold (default: --region)")
    f.add_argument("--include-unmapped", action="store_true", help="sample calls on unaligned bases too")
    m = p.add_argument_group("modified bases")
    c = m.add_mutually_exclusive_group()
    c.add_argument("--ignore", help="drop this mod code, sharing its probability among the other classes")
    c.add_argument("--combine-mods", action="store_true", help="count all mod codes of a base together")
    m.add_argument("--force-allow-implicit", action="store_true", help="read MM entries without ?/. as '.' (implicit canonical)")
    m.add_argument("--motif", nargs=2, action="append", metavar=("MOTIF", "OFFSET"), help="only sites of this motif; repeatable")
    m.add_argument("--cpg", action="store_true", help="only CpG sites (--motif CG 0)")
    m.add_argument("-r", "--ref", "--reference", type=Path, help="reference FASTA (with .fai) for --motif/--cpg")
    m.add_argument("--combine-strands", action="store_true", help="sum + and - strand counts of each motif site")
    m.add_argument("--preset", choices=["traditional"], help="traditional: --cpg --combine-strands --ignore h")
    o = p.add_argument_group("output")
    d = o.add_mutually_exclusive_group()
    d.add_argument("--only-tabs", action="store_true", help="all columns tab-separated (the default)")
    d.add_argument("--mixed-delim", "--mixed-delimiters", action="store_true", help="columns 10-18 space-separated")
    o.add_argument("--header", "--with-header", action="store_true", help="write a header line")


def _check(args: argparse.Namespace) -> None:
    if args.preset:
        if args.combine_mods or args.cpg or args.combine_strands or args.ignore or args.motif:
            raise ConfigError("--preset cannot be combined with --cpg, --motif, --combine-strands, --ignore or --combine-mods")
        args.cpg, args.combine_strands, args.ignore = True, True, "h"
    if (args.motif or args.cpg) and args.ref is None:
        raise ConfigError("--motif and --cpg need --ref")
    if args.combine_strands and not (args.motif or args.cpg):
        raise ConfigError("--combine-strands needs --motif or --cpg")
    if args.seed is not None and args.sampling_frac is None:
        raise ConfigError("--seed needs --sampling-frac (-f)")
    if args.filter_percentile is not None and not 0 <= args.filter_percentile <= 1:
        raise ConfigError("--filter-percentile must be between 0 and 1")
    if args.sampling_frac is not None and not 0 < args.sampling_frac <= 1:
        raise ConfigError("--sampling-frac must be in (0, 1]")


def run(args: argparse.Namespace) -> int:
    _check(args)
    inputs = BamInputs(args.bams)
    region = parse_region(args.region, dict(inputs.contigs)) if args.region else None
    motifs = parse_motifs(args.motif, args.cpg)
    if args.combine_strands and any(not m.palindrome for m in motifs):
        raise ConfigError("--combine-strands needs reverse-complement palindromic motifs")
    sites = None
    if motifs:
        reference = load_reference(args.ref, [n for n, _ in inputs.contigs])
        sites = {name: contig_sites(motifs, seq, args.combine_strands) for name, seq in reference.items()}
    ignore = normalise_code(args.ignore) if args.ignore else None
    try:  # fail before the work, as modkit does
        out = sys.stdout if args.output in ("-", "stdout") else open(args.output, "w")
    except OSError as exc:
        raise InputError(args.output, f"cannot write: {exc.strerror}") from None
    try:
        options = CallOptions(_thresholds(args, inputs, region, ignore), ignore, args.combine_mods,
                              args.force_allow_implicit)
        counts = PileupCounts(inputs.contigs, options, sites,
                              (region.contig, region.start, region.end) if region else None)
        if args.header:
            out.write(HEADER)
        aggregate(inputs, counts, BedMethylWriter(out, counts, Layout(tuple(motifs), sites, args.combine_strands,
                                                                        args.mixed_delim)), region)
    finally:
        if out is not sys.stdout:
            out.close()
    log.info("%d reads, %d calls counted", counts.n_reads, counts.n_calls)
    return 0


def _thresholds(args, inputs: BamInputs, region, ignore: str | None) -> Thresholds:
    if args.filter_threshold:
        return parse_filter_thresholds(args.filter_threshold, args.mod_thresholds)
    if args.no_filtering:
        return Thresholds()
    sample_region = parse_region(args.sample_region, dict(inputs.contigs)) if args.sample_region else region
    sampling = Sampling(args.filter_percentile if args.filter_percentile is not None else 0.1,
                        args.num_reads if args.num_reads is not None else 10_042,
                        args.sampling_frac, args.seed, args.include_unmapped, ignore)
    estimated = estimate_thresholds(inputs, sampling, sample_region)
    for b, t in sorted(estimated.per_base.items()):
        log.info("estimated pass threshold %s for %s", t, "ACGT"[b])
    return Thresholds(0.0, estimated.per_base, parse_mod_thresholds(args.mod_thresholds))


def aggregate(inputs: BamInputs, counts: PileupCounts, writer: BedMethylWriter, region=None) -> None:
    """Count every record in batches; with sorted inputs, write and free sites behind the stream."""
    released = 0
    for batch in record_batches(inputs, region):
        if inputs.sorted:
            for rec, path in batch:
                if rec.reference_id >= 0 and counts.goff[rec.reference_id] + rec.reference_start < released:
                    raise InputError(path, "the header says coordinate-sorted but this read is out of order", rec.query_name)
        counts.add(batch)
        last = batch[-1][0]
        if inputs.sorted and last.reference_id >= 0:
            boundary = int(counts.goff[last.reference_id] + last.reference_start)
            boundary -= boundary % tally.BLOCK
            if boundary > released:
                writer.write(counts.release_before(boundary), boundary)
                released = boundary
    writer.write(counts.rows())
