"""Configuration of `streamer run`: one schema, shipped defaults, validation with key paths.

The schema is the frozen dataclasses below; each field carries its help text and its
command-line flag, so the defaults file (`config/streamer.yaml`, rendered by
`render_defaults`), the flags of `streamer run` and the validation cannot drift apart.
A configuration is read once at start (defaults, then the YAML file, then flags) and every
problem is reported together, each with its key path; `ConfigError` makes the command exit
with status 78, which the systemd units do not restart on.

It is over 400 lines because every key is declared here with its help text, flag and limits:
that is what keeps the defaults file, the flags and the validation from drifting apart.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from streamer.align import ENGINES
from streamer.errors import ConfigError
from streamer.pipeline.chemistry import DEFAULT, PORES, folder_models, models_by_pore
from streamer.pore.motifs import CPG, MOTIFS
from streamer.tuning.profiles import PROFILE_NAMES, parse_size

REQUIRED_FOR_RUN = ("watch.dir", "reference.genome", "output.dir")


# where each setting the tuner resolves (`streamer.tuning.session.plan_config`) lives in the configuration
TUNABLE_KEYS = {"max_reads": ("batch", "max_reads"), "max_bases": ("batch", "max_bases"), "max_lf": ("gpu", "max_lf"),
                "max_epk": ("gpu", "max_epk"), "avg_epk": ("gpu", "avg_epk"),
                "ultra_thresh": ("gpu", "ultra_thresh"), "threads": ("pipeline", "threads"),
                "mem_frac": ("gpu", "mem_frac"), "memory_budget": ("pipeline", "memory_budget"),
                "gpu_reserve": ("gpu", "reserve"), "gpu_memory": ("gpu", "memory"),
                "stream_priority": ("gpu", "stream_priority"), "gpu_events": ("gpu", "events"),
                "gpu_balance": ("gpu", "balance")}  # fmt: skip
# keys holding a size (`300M`, `2G`, a number of bytes) or `auto`
SIZE_KEYS = ("pipeline.memory_budget", "gpu.reserve", "gpu.memory")


def _sink_choices() -> tuple[str, ...]:
    """The outputs installed (`streamer.sinks` entry points)."""
    from streamer import registry

    return tuple(registry.names(registry.SINKS))


def _key(default: Any, help: str, *, type: type, flag: str, short: str | None = None,
         choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None, minimum: float | None = None,
         must_exist: str | None = None):
    """A config key: its default, what it means, its flag and its constraints."""
    return field(default=default, metadata={
        "help": help, "type": type, "flag": flag, "short": short,
        "choices": choices, "minimum": minimum, "must_exist": must_exist,
    })


@dataclass(frozen=True)
class WatchConfig:
    dir: Path | None = _key(
        None, "Folder to watch: a MinKNOW run folder, a folder holding several (restarted) runs, or a plain "
        "folder of signal and basecall files. Required.", type=Path, flag="--watch", must_exist="dir")
    also: tuple[str, ...] = _key(
        (), "More run folders watched by the same daemon, each a run of its own with its output folder "
        "`OUTDIR/<folder name>` and its ledger, sharing the warm pipeline and the GPUs; `dir` is then one of the "
        "runs too (the flag may be repeated).", type=tuple, flag="--watch-also")
    each_run: bool = _key(
        False, "`dir` is a parent folder (MinKNOW's data folder): each folder in it, and each that appears "
        "later, is a run of its own as with `also`; the daemon runs until SIGTERM or the STOP file in `dir`.",
        type=bool, flag="--each-run")
    poll: bool = _key(
        False, "Poll the folder instead of relying on inotify (network mounts, where inotify is silent).",
        type=bool, flag="--poll")
    poll_interval: float = _key(
        2.0, "Seconds between polls, and between checks of files that are not complete yet.",
        type=float, flag="--poll-interval", minimum=0.05)
    settle: float = _key(
        5.0, "Seconds a file without an end marker (FAST5, plain FASTQ/FASTA) must stay unchanged before it is "
        "read when no close or move event announced it (start-up scan, polling).",
        type=float, flag="--settle", minimum=0.0)
    incomplete_timeout: float = _key(
        300.0, "Seconds a file may stay unchanged and still incomplete (no end marker, or a FAST5 that does not "
        "open) before it is reported as truncated or corrupt and set aside.",
        type=float, flag="--incomplete-timeout", minimum=0.0)
    include_fail: bool = _key(
        False, "Also process reads that failed basecalling QC (`*_fail` folders and `fast5_skip`).",
        type=bool, flag="--include-fail")
    basecalls: str = _key(
        "auto", "Where basecalls come from: `bam` (MinKNOW/dorado BAM; its alignments are used when it has "
        "them), `fastq` (FASTQ or FASTA), or `auto`: chosen read by read. In a run that writes BAM (a "
        "`bam_pass` folder, or BAM files beside the FASTQ) a read takes its BAM record, and its FASTQ basecall "
        "only when no BAM record of it can be read (its BAM is unreadable, fails when read again, or never "
        "lands); one line says so each time. Runs without BAM use FASTQ.",
        type=str, flag="--basecalls", choices=("auto", "bam", "fastq"))


@dataclass(frozen=True)
class EndConfig:
    follow: bool = _key(
        False, "Keep watching forever: a final_summary or the idle timeout does not end the run (SIGTERM or the "
        "STOP file still do).", type=bool, flag="--follow")
    final_summary_grace: float = _key(
        30.0, "Seconds to keep watching after every run folder has its `final_summary*.txt`, for files still "
        "being moved in; the run ends sooner once every file the summaries count is in.", type=float,
        flag="--grace", minimum=0.0)
    idle_timeout: float = _key(
        0.0, "Seconds without a new file after which the run is over; 0 waits for a final_summary.",
        type=float, flag="--idle-timeout", minimum=0.0)
    stop_file: str = _key(
        "STOP", "Name of a file that, once it appears in the watched folder, ends the run.",
        type=str, flag="--stop-file")


@dataclass(frozen=True)
class ReferenceConfig:
    genome: Path | None = _key(
        None, "Reference FASTA (plain, bgzip or gzip). Required.", type=Path, flag="--genome", short="-g",
        must_exist="file")
    index: Path | None = _key(
        None, "Prebuilt minimap2 index (`.mmi`) for basecalls that come without alignments; by default an index "
        "is built from `genome` at start.", type=Path, flag="--mm-index", must_exist="file")
    preset: str = _key(
        "map-ont", "minimap2 preset for those alignments.", type=str, flag="--preset")


@dataclass(frozen=True)
class AlignmentConfig:
    min_mapq: int = _key(20, "Minimum mapping quality of an alignment record.", type=int, flag="--min-mapq",
                         minimum=0)
    secondary: bool = _key(False, "Also call on secondary alignments.", type=bool, flag="--secondary")
    engine: str = _key(
        "auto", "Aligner for basecalls that come without alignments: `mappy` (minimap2's map-ont, with "
        "`reference.index` and `reference.preset`), or streamer's own FM-index seeds, chains and base-level "
        "extension with its seeding on the `gpu` or the `cpu` (the index is built beside the reference once and "
        "reused); `auto`: the gpu engine where a GPU is there and it agrees with mappy on reads simulated from "
        "the reference (checked once per index, kept beside it), else mappy; the log and summary.json say "
        "which and why.", type=str, flag="--align-engine", choices=ENGINES)


@dataclass(frozen=True)
class JoinConfig:
    timeout: float = _key(
        3600.0, "Seconds a read may wait for its partner (signal or basecalls) while the run goes on; then it is "
        "reported as missing one (at the end of a run, at once). A partner landing later still has the read "
        "called, and skipped.tsv says it was recovered.", type=float, flag="--join-timeout",
        minimum=0.0)
    max_pending_bases: int = _key(
        200_000_000, "Most bases of basecalls held in memory while they wait for their signal, and at most a tenth "
        "of pipeline.memory_budget (2 bytes a base); beyond that the oldest are dropped and read again from "
        "their file when their signal lands.",
        type=int, flag="--max-pending-bases", minimum=0)


@dataclass(frozen=True)
class BatchConfig:
    max_reads: int = _key(512, "Most reads per batch (with all their alignment records).", type=int, flag="--batchsize", short="-K",
                          minimum=1)
    max_bases: int = _key(5_000_000, "Most read bases per batch.", type=int, flag="--max-bases", short="-B",
                          minimum=1)
    max_wait: float = _key(
        5.0, "Seconds the first read of a batch may wait for the batch to fill before a partial batch is "
        "processed.", type=float, flag="--max-wait", minimum=0.0)
    read_ahead: bool = _key(
        True, "Read the signal of the next matched reads (one batch at most) while a batch is computed, as "
        "`streamer call` does; it costs the memory of one batch's signal.", type=bool, flag="--read-ahead")


@dataclass(frozen=True)
class PipelineConfig:
    threads: int = _key(0, "CPU threads for the stages; 0 uses every core.", type=int, flag="--threads",
                        short="-t", minimum=0)
    compute_threads: int = _key(
        2, "Batches in the stages at once, so that CPU and GPU stages overlap (as `streamer call --compute-threads`); "
        "with the batches read ahead they are the batches in flight, which the memory budget holds. Each has a lane "
        "of its own on a GPU (an arena, buffers and a stream), within the same share of its memory.", type=int,
        flag="--compute-threads", minimum=1)
    pore: str = _key(
        "auto", "Pore chemistry of the watched runs; it picks the models that `kmer_model` and `meth_model` leave "
        f"unset: {models_by_pore()}; auto: from the signal files' run metadata (flow cell, kit), {DEFAULT.name} when they do not say. Without "
        "a chemistry's CpG model the daemon calls no methylation and writes the rest.", type=str, flag="--pore",
        choices=("auto", *PORES))
    kmer_model: Path | None = _key(None, "Nucleotide pore model file, text or uncalled4 .npz (default: by "
                                   "`pore`).", type=Path, flag="--kmer-model", must_exist="file")
    methylation: str = _key(
        CPG.name, "The motif whose methylation is called, as nanopolish's `--methylation`: `cpg`, `gpc` (GpC, "
        "NOMe-seq), `dam` (G6mATC) or `dcm` (C5mCWGG); `meth_model` is then a model of that motif (the shipped "
        "R9.4.1 ones by default).", type=str, flag="--methylation", choices=tuple(MOTIFS))
    meth_model: Path | None = _key(None, "Methylation pore model file of the `methylation` motif, nanopolish/f5c "
                                   "text (default: by `pore`).", type=Path, flag="--meth-model", must_exist="file")
    model_dir: Path | None = _key(
        None, f"Folder of per-pore models ({folder_models()}); default `$STREAMER_MODEL_DIR`, else "
        "`$XDG_DATA_HOME/streamer/models`.", type=Path, flag="--model-dir")
    io_mode: str = _key(
        "auto", "Signal readers of `batch.read_ahead` as `processes` or `threads`; `auto` takes processes (threads "
        "under a budget below 1G), as reader threads hold a lock or the GIL from the stages.", type=str,
        flag="--io-mode", choices=("auto", "processes", "threads"))
    memory_budget: str = _key(
        "auto", "Host memory the run may take, summed over its processes (e.g. `300M`, `2G`): the batch cap B, the "
        "batches read ahead and in the stages at once, and whether signal readers are processes are derived from it, "
        "so that peak memory does not grow with the input; auto: the device profile's (300M on a CPU-only host of up "
        "to 4 threads). On a Jetson the GPU's memory is the host's and the budget holds both: the GPU part (the arena "
        "for B, the HMM's buffers) gets what the host part leaves.", type=str, flag="--memory-budget")


@dataclass(frozen=True)
class GpuConfig:
    disable: bool = _key(False, "Align on the CPU only, even where numba-cuda and an NVIDIA GPU are present.",
                         type=bool, flag="--disable-cuda")
    disable_hmm: bool = _key(False, "Run the CpG HMM on the CPU while ABEA runs on the GPU.", type=bool,
                             flag="--disable-cuda-hmm")
    events: bool | None = _key(
        None, "Detect events on the GPU too (the same events, bit for bit), ahead of the GPU stages on a lane of their "
        "own, which leaves the host's cores to the rest; unset: the device profile's, on for `workstation` and `hpc` "
        "(a GPU of its own with memory to spare for their buffers), off on laptops and Jetsons, whose GPU a live "
        "basecaller shares (benchmarks/RESULTS-cpu-half.md).", type=bool, flag="--cuda-events")
    balance: bool | None = _key(
        None, "Let the tuner (`autotune`) move the CPU/GPU split of ABEA (max_lf, max_epk, ultra_thresh, and K and B "
        "for reads out of the arena) on the load tree's advice, as well as the batch's shape on the memory tree's; "
        "unset: not where events are on the GPU, where the daemon's other stages hold the host's cores and such "
        "moves cost throughput (benchmarks/RESULTS-cpu-half.md).", type=bool, flag="--balance")
    device: str = _key("0", "GPU to use, a list of them (`0,1`) or `all`: each batch goes to the least loaded.",
                       type=str, flag="--cuda-dev-id")
    mem_frac: float | None = _key(
        None, "Most of the free GPU memory to take (the ABEA arena is sized for the batches, the HMM's memory "
        "beside it); unset: 0.9, or 0.7 on integrated GPUs (Jetson).", type=float,
        flag="--cuda-mem-frac", minimum=0.01)
    reserve: str = _key(
        "auto", "Device memory never taken (e.g. `2G`): the share of a process beside the daemon on the same GPU, "
        "such as MinKNOW's live basecaller on a MinION Mk1C/Mk1D or a Jetson; `mem_frac` applies to the free "
        "memory less it. auto: the device profile's (0 but on a Jetson).", type=str, flag="--gpu-reserve")
    memory: str | None = _key(
        None, "Most device memory the daemon takes (its arena, the HMM's buffers, the kernel modules), e.g. `3G`; "
        "unset: `mem_frac` alone, and on a Jetson the share of `pipeline.memory_budget` the host part leaves.",
        type=str, flag="--gpu-memory")
    stream_priority: str = _key(
        "auto", "Priority of the CUDA streams every kernel and copy of the GPU stages runs on: `low` (the device's "
        "lowest) leaves the GPU first to the streams another process asks for above it, such as a live "
        "basecaller's; auto: the device profile's (low on a Jetson).", type=str, flag="--gpu-stream-priority",
        choices=("auto", "normal", "low"))
    avg_epk: float = _key(2.0, "Events per k-mer assumed when sizing the GPU arena.", type=float,
                          flag="--cuda-avg-epk", minimum=0.1)
    max_lf: float = _key(3.0, "Reads longer than this times the batch's mean length go to the CPU.", type=float,
                         flag="--cuda-max-lf", minimum=0.1)
    max_epk: float = _key(5.0, "Reads with more events per k-mer than this go to the CPU.", type=float,
                          flag="--cuda-max-epk", minimum=0.1)
    ultra_thresh: int = _key(100_000, "Reads longer than this are aligned on the CPU after the rest of their "
                             "batch.", type=int, flag="--ultra-thresh", minimum=1)
    profile: str = _key(
        "auto", "Device profile the batch caps, the GPU keys above and the threads start from (like f5c's -x); "
        "`auto` picks one from the GPU's name and memory and the CPU count. A key set to anything but its default "
        "overrides the profile.", type=str, flag="--profile", choices=("auto", *PROFILE_NAMES))
    autotune: bool = _key(
        True, "Tune the batch caps and the GPU split (max_lf, max_epk, avg_epk, ultra_thresh) while running, on "
        "the advice of f5c's tuning monitor; what is learned is kept per GPU in the state folder for the next "
        "start.", type=bool, flag="--autotune")


@dataclass(frozen=True)
class OutputConfig:
    dir: Path | None = _key(
        None, "Output folder: `meth.tsv`, `meth-freq.tsv`, `meth.bed`, `skipped.tsv`, `summary.json`, and "
        "`eventalign.tsv` and `modbam/` when enabled. Required.",
        type=Path, flag="--output", short="-o", must_exist="writable")
    state_dir: Path | None = _key(
        None, "Folder of the ledger (SQLite) that makes output exactly-once across restarts; default "
        "`OUTDIR/.streamer`.", type=Path, flag="--state-dir",
        must_exist="writable")
    refresh_interval: float = _key(
        30.0, "Seconds between rewrites of `meth-freq.tsv`, `meth.bed` and `modkit.bed` (all are also written "
        "when the daemon stops).", type=float, flag="--refresh-interval", minimum=0.0)
    call_threshold: float = _key(
        2.5, "meth-freq: a site is called when |log-likelihood ratio| is at least this.", type=float,
        flag="--call-threshold", minimum=0.0)
    split_groups: bool = _key(False, "meth-freq: split groups of several sites (CpGs, or the sites of "
                              "`pipeline.methylation`) into one row per site.", type=bool, flag="--split-groups")
    freq_compat: str = _key(
        "f5c", "meth-freq: whose counting rule: `f5c` meth-freq's (a call counts when |log-likelihood ratio| >= "
        "`call_threshold`) or `nanopolish`'s calculate_methylation_frequency.py (>= `call_threshold` times the "
        "group's sites; the script's threshold is 2.0).", type=str, flag="--freq-compat", choices=("f5c", "nanopolish"))
    bedmethyl: bool = _key(
        True, "Also write `meth.bed`: per-CpG, per-strand counts as modkit's bedMethyl (what `streamer call "
        "--bedmethyl` gives on the same reads), replaced whole whenever `meth-freq.tsv` is.", type=bool,
        flag="--bedmethyl")
    modbam: bool = _key(
        False, "Also write modBAM: once every read of a basecall BAM is done, a copy of that BAM with the calls "
        "as MM/ML tags, at `modbam/` plus its path below the watched folder. Off by default: each BAM is read "
        "and written once more (disk and time), and basecalls from FASTQ or unaligned BAM get none (their "
        "alignments are the daemon's own).", type=bool, flag="--modbam")
    sinks: tuple[str, ...] = _key(
        (), "More outputs, by the name of their `streamer.sinks` entry point (a plugin package's own), each "
        "writing its files in the output folder; the standard ones above are set by their own keys.",
        type=tuple, flag="--sink", choices=_sink_choices)


@dataclass(frozen=True)
class EventalignConfig:
    enabled: bool = _key(
        False, "Also write `eventalign.tsv` (the rows of `streamer eventalign` for every read that passes "
        "alignment QC, appended batch by batch like `meth.tsv`) and publish them on the `eventalign` topic. Off by default: the rows "
        "take about 180 bytes per read base, some 60 times `meth.tsv`, and the realignment (on the CPU) and "
        "printing about as much time again as the calls.", type=bool, flag="--eventalign")
    print_read_names: bool = _key(
        True, "Read names in the read column; otherwise `read_index`, the read's number in the ledger (the "
        "`id` of its row in `reads`): a record's place in one BAM, as the offline command numbers it, names "
        "nothing across the many files of a run.", type=bool, flag="--print-read-names")
    scale_events: bool = _key(
        False, "Scale events to the model, not the model to the events.", type=bool, flag="--scale-events")
    signal_index: bool = _key(
        False, "Each event's first and past-last sample index.", type=bool, flag="--signal-index")
    samples: bool = _key(
        False, "Each event's samples, scaled to the model (much larger rows).", type=bool, flag="--samples")


@dataclass(frozen=True)
class ModcallsConfig:
    enabled: bool = _key(
        True, "Aggregate the modified-base calls (MM/ML tags) of the basecall BAMs as `modkit pileup` does, "
        "live, into `modkit.bed` (bedMethyl, refreshed with the other tables) and the `meth.freq` stream "
        "(source `dorado`). Each BAM is counted once through the ledger; BAMs without MM/ML add nothing.",
        type=bool, flag="--modcalls")
    filter_threshold: tuple[str, ...] = _key(
        (), "Fixed pass thresholds, as `modkit pileup --filter-threshold`: global (`0.8`) or per base "
        "(`C:0.7`). Empty: estimated once, as modkit does (the `filter_percentile` quantile of the call "
        "confidences), from the run's first BAM with calls, then kept in the ledger for the whole run; "
        "the value is logged and in summary.json, so `streamer pileup --filter-threshold` reproduces "
        "the table offline.", type=tuple, flag="--mod-filter-threshold")
    filter_percentile: float = _key(
        0.1, "The quantile of call confidences the estimated threshold is (modkit's default 0.1).",
        type=float, flag="--mod-filter-percentile", minimum=0.0)
    no_filtering: bool = _key(
        False, "Count every call, whatever its confidence (`modkit pileup --no-filtering`).", type=bool,
        flag="--mod-no-filtering")
    cpg: bool = _key(
        True, "Only CpG sites of the reference (`modkit pileup --cpg`): one row per CpG and strand, about "
        "2.5 GB for every CpG of a human genome. Off: every covered position has rows (some 90 bytes per "
        "covered base: for small genomes and panels).", type=bool, flag="--mod-cpg")
    combine_strands: bool = _key(
        False, "Sum the + and - strand counts of each CpG (`--combine-strands`).", type=bool,
        flag="--mod-combine-strands")
    ignore: str | None = _key(
        None, "Drop this mod code, sharing its probability among the others (`--ignore h`).", type=str,
        flag="--mod-ignore")
    combine_mods: bool = _key(
        False, "Count all mod codes of a base together (`--combine-mods`).", type=bool, flag="--mod-combine-mods")


@dataclass(frozen=True)
class ServiceConfig:
    drain_timeout: float = _key(
        60.0, "Seconds SIGTERM waits for the batch in hand; past that the daemon exits without it and it is "
        "redone at the next start.", type=float, flag="--drain-timeout", minimum=0.0)
    stall_timeout: float = _key(
        900.0, "Seconds without progress in the processing loop after which systemd's watchdog is no longer "
        "fed (so systemd restarts a hung daemon).", type=float, flag="--stall-timeout", minimum=1.0)
    status_interval: float = _key(
        10.0, "Seconds between status updates (systemd STATUS line, publisher status, `summary.json`) while no "
        "batch is committed; each committed batch updates them too.", type=float,
        flag="--status-interval", minimum=0.1)
    metrics: str | None = _key(
        None, "Serve the daemon's counters, state, latency and the tuning monitor's settings for Prometheus at "
        "http://ADDRESS/metrics: `PORT` (on loopback) or `HOST:PORT`; the numbers of `summary.json` and the status "
        "heartbeats. Unset serves none.", type=str, flag="--metrics")


@dataclass(frozen=True)
class PublishConfig:
    endpoint: str | None = _key(
        None, "ZeroMQ PUB endpoint for calls, frequencies, status and run events, e.g. `tcp://127.0.0.1:5556`; "
        "unset publishes nothing. Addresses beyond loopback need CURVE keys.",
        type=str, flag="--publish")
    extra_endpoints: tuple[str, ...] = _key(
        (), "More endpoints the same stream is published on besides `endpoint`, e.g. "
        "`[ipc:///run/streamer/pub.sock]` for local subscribers without TCP (the flag may be repeated); the "
        "loopback and CURVE rules apply to them too.",
        type=tuple, flag="--publish-also")
    send_hwm: int = _key(
        1000, "Messages queued per subscriber before a slow subscriber loses messages (ZeroMQ's send "
        "high-water mark); the daemon never waits for a subscriber.", type=int, flag="--publish-hwm", minimum=1)
    snapshot_endpoint: str | None = _key(
        None, "ZeroMQ endpoint serving the current frequency table to late subscribers, e.g. "
        "`tcp://127.0.0.1:5557`.", type=str, flag="--snapshot")
    heartbeat_interval: float = _key(2.0, "Seconds between status heartbeats on the stream.", type=float,
                                     flag="--heartbeat-interval", minimum=0.1)
    curve_secret_key: Path | None = _key(
        None, "This publisher's CURVE key (`NAME.key_secret`, from `streamer keys generate`): subscribers must "
        "then authenticate, and the endpoints may be beyond loopback.", type=Path, flag="--curve-secret-key",
        must_exist="file")
    curve_clients: Path | None = _key(
        None, "Public keys (`*.key`) of the subscribers let in: a key file or a folder of them.", type=Path,
        flag="--curve-clients", must_exist="any")
    insecure_bind: bool = _key(
        False, "Allow endpoints beyond loopback without CURVE (unauthenticated, unencrypted).", type=bool,
        flag="--insecure-bind")


@dataclass(frozen=True)
class Config:
    watch: WatchConfig = field(default_factory=WatchConfig)
    end: EndConfig = field(default_factory=EndConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)
    join: JoinConfig = field(default_factory=JoinConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    eventalign: EventalignConfig = field(default_factory=EventalignConfig)
    modcalls: ModcallsConfig = field(default_factory=ModcallsConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)

    def state_dir(self) -> Path:
        if self.output.state_dir is not None:
            return self.output.state_dir
        assert self.output.dir is not None
        return self.output.dir / ".streamer"

    def tunables(self) -> dict[str, Any]:
        """The settings the tuner resolves, by its names (`TUNABLE_KEYS`)."""
        return {k: getattr(getattr(self, sec), key) for k, (sec, key) in TUNABLE_KEYS.items()}

    def with_tunables(self, values: dict[str, Any]) -> Config:
        """This configuration with the tuner's resolved settings in their sections."""
        cfg = self
        for section in ("batch", "gpu", "pipeline"):
            keys = {key: values[k] for k, (sec, key) in TUNABLE_KEYS.items() if sec == section}
            cfg = replace(cfg, **{section: replace(getattr(cfg, section), **keys)})
        return cfg

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """Plain values (paths as strings), for the start-up log and summary.json."""
        return {sec.name: {f.name: _plain(getattr(getattr(self, sec.name), f.name)) for f in fields(sec.type)}
                for sec in _sections()}


@dataclass(frozen=True)
class Key:
    """One key of the schema, flattened."""

    path: str
    default: Any
    help: str
    type: type
    flag: str
    short: str | None
    choices: tuple[str, ...] | None
    minimum: float | None
    must_exist: str | None


def _sections():
    return [_Section(f.name, f.default_factory) for f in fields(Config)]


@dataclass(frozen=True)
class _Section:
    name: str
    type: type


def schema() -> list[Key]:
    """Every key, in file order."""
    keys = []
    for sec in _sections():
        for f in fields(sec.type):
            m = f.metadata
            keys.append(Key(f"{sec.name}.{f.name}", f.default if f.default is not MISSING else None, m["help"],
                            m["type"], m["flag"], m["short"],
                            m["choices"]() if callable(m["choices"]) else m["choices"], m["minimum"],
                            m["must_exist"]))
    return keys


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value


# ---------------------------------------------------------------------------- the defaults file

_HEADER = """\
# streamer run: configuration, every key with its default.
#
# Values given here override these defaults; command-line flags (shown in brackets) override
# this file. Check a file with `streamer validate-config FILE`; print this one with
# `streamer validate-config --defaults`.
"""


def render_defaults() -> str:
    """The documented defaults file, `config/streamer.yaml` (a test keeps the two identical)."""
    out = [_HEADER]
    section = None
    for key in schema():
        sec, name = key.path.split(".")
        if sec != section:
            out.append(f"\n{sec}:\n")
            section = sec
        flag = f"{key.short}/{key.flag}" if key.short else key.flag
        text = f"{key.help} [{flag}]"
        if key.choices:
            text += f" One of: {', '.join(key.choices)}."
        out.extend(f"  # {line}\n" for line in textwrap.wrap(text, 92, break_on_hyphens=False))
        out.append(f"  {name}: {_yaml_scalar(key.default)}\n")
    return "".join(out)


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1_000_000:
        return f"{value:_d}"  # YAML reads 1_000_000 as an integer
    return yaml.safe_dump(_plain(value), default_flow_style=True).strip().removesuffix("\n...").strip()


# ---------------------------------------------------------------------------- loading and validation


def read_file(path: Path) -> dict[str, Any]:
    """The YAML mapping in `path` (empty file: empty mapping)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def flatten(data: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """`{section: {key: v}}` -> `{"section.key": v}`, reporting unknown sections and keys."""
    keys = {k.path for k in schema()}
    sections = [s.name for s in _sections()]
    flat: dict[str, Any] = {}
    for sec, body in data.items():
        if sec not in sections:
            problems.append(f"{sec}: unknown section{_suggest(str(sec), sections)}")
            continue
        if body is None:
            continue
        if not isinstance(body, dict):
            problems.append(f"{sec}: expected a mapping of keys, got {_describe(body)}")
            continue
        for name, value in body.items():
            path = f"{sec}.{name}"
            if path not in keys:
                known = [k.split(".", 1)[1] for k in keys if k.startswith(sec + ".")]
                problems.append(f"{path}: unknown key{_suggest(str(name), known)}")
                continue
            flat[path] = value
    return flat


def _suggest(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _coerce(key: Key, value: Any, problems: list[str]) -> Any:
    """The value with its schema type, or `None` with a problem recorded."""
    if value is None:
        if key.default is None or key.type is tuple:  # an empty list may be written as nothing
            return None
        problems.append(f"{key.path}: must not be empty (default: {_plain(key.default)!r})")
        return None
    t = key.type
    if t is bool:
        if isinstance(value, bool):
            return value
        problems.append(f"{key.path}: expected true or false, got {_describe(value)}")
        return None
    if t is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return _check_minimum(key, value, problems)
        problems.append(f"{key.path}: expected an integer, got {_describe(value)}")
        return None
    if t is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                problems.append(f"{key.path}: expected a finite number, got {value}")
                return None
            return _check_minimum(key, float(value), problems)
        problems.append(f"{key.path}: expected a number, got {_describe(value)}")
        return None
    if t is tuple:
        items = [value] if isinstance(value, str) else value
        if isinstance(items, (list, tuple)) and all(isinstance(v, str) and v for v in items):
            unknown = [v for v in items if key.choices and v not in key.choices]
            if unknown:
                problems.append(f"{key.path}: expected names from {', '.join(key.choices)}, got {', '.join(unknown)}")
                return None
            return tuple(items)
        problems.append(f"{key.path}: expected a list of strings, got {_describe(value)}")
        return None
    if t is str and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # YAML reads `device: 1` as a number
    if key.path == "gpu.device" and isinstance(value, str) and not _device_spec_ok(value):
        problems.append(f"{key.path}: expected a GPU number, a list of them (0,1) or all, got {value!r}")
        return None
    if not isinstance(value, (str, Path)) or str(value) == "":
        problems.append(f"{key.path}: expected {'a path' if t is Path else 'a string'}, got {_describe(value)}")
        return None
    if key.choices and value not in key.choices:
        problems.append(f"{key.path}: expected one of {', '.join(key.choices)}, got {value!r}")
        return None
    return Path(value).expanduser() if t is Path else str(value)


def _device_spec_ok(spec: str) -> bool:
    from streamer.pipeline.gpu import CudaOptions

    try:
        CudaOptions().with_devices(spec)
    except ValueError:
        return False
    return True


ENDPOINT_KEYS = ("publish.endpoint", "publish.extra_endpoints", "publish.snapshot_endpoint")
_ENDPOINT = re.compile(r"(tcp://(\[[0-9a-fA-F:.]+\]|[^:/\s]+):(\*|\d{1,5})|ipc://\S+|inproc://\S+)")


def is_endpoint(text: str) -> bool:
    """ZeroMQ endpoint syntax, as the publisher and its subscribers take it."""
    return bool(_ENDPOINT.fullmatch(text))


def _check_endpoints(values: dict[str, dict[str, Any]], problems: list[str]) -> None:
    """ZeroMQ endpoint syntax, and the rule the publisher applies before binding: beyond loopback
    only with CURVE keys or insecure_bind, so `run` never fails on what validation passed."""
    from streamer.publish.security import is_loopback  # here: the publisher's package imports ZeroMQ, which a
    # command that reads no daemon configuration (`call`) need not load

    pub = values["publish"]
    for path in ENDPOINT_KEYS:
        given = pub.get(path.split(".")[1])
        for endpoint in (given,) if isinstance(given, str) else given or ():
            if not is_endpoint(endpoint):
                problems.append(f"{path}: {endpoint!r} is not a ZeroMQ endpoint (tcp://HOST:PORT, ipc://PATH)")
            elif not (is_loopback(endpoint) or pub.get("curve_secret_key") or pub.get("insecure_bind")):
                problems.append(f"{path}: {endpoint} is beyond loopback: set publish.curve_secret_key and "
                                "publish.curve_clients (`streamer keys generate`), or publish.insecure_bind")  # fmt: skip


def _check_minimum(key: Key, value: float, problems: list[str]) -> float | None:
    if key.minimum is not None and value < key.minimum:
        problems.append(f"{key.path}: must be at least {key.minimum:g}, got {value:g}")
        return None
    return value


def _check_exists(key: Key, path: Path, problems: list[str]) -> None:
    if key.must_exist == "dir":
        if not path.is_dir():
            problems.append(f"{key.path}: {path}: no such folder")
        elif not os.access(path, os.R_OK | os.X_OK):
            problems.append(f"{key.path}: {path}: folder is not readable")
    elif key.must_exist == "file":
        if not path.is_file():
            problems.append(f"{key.path}: {path}: no such file")
        elif not os.access(path, os.R_OK):
            problems.append(f"{key.path}: {path}: file is not readable")
    elif key.must_exist == "any":
        if not path.exists():
            problems.append(f"{key.path}: {path}: no such file or folder")
    elif key.must_exist == "writable":
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing.exists() and not existing.is_dir():
            problems.append(f"{key.path}: {existing}: not a folder")
        elif not os.access(existing, os.W_OK | os.X_OK):
            problems.append(f"{key.path}: {existing}: folder is not writable")


def build(flat: dict[str, Any], *, origin: str = "configuration", require: tuple[str, ...] = REQUIRED_FOR_RUN,
          problems: list[str] | None = None) -> Config:
    """A validated `Config` from `{"section.key": value}` over the defaults; all problems at once."""
    problems = [] if problems is None else problems
    values: dict[str, dict[str, Any]] = {s.name: {} for s in _sections()}
    for key in schema():
        if key.path not in flat:
            continue
        value = _coerce(key, flat[key.path], problems)
        if value is None:
            continue
        if isinstance(value, Path) and key.must_exist:
            _check_exists(key, value, problems)
        sec, name = key.path.split(".")
        values[sec][name] = value
    _check_endpoints(values, problems)
    for path in SIZE_KEYS:
        sec, name = path.split(".")
        if values[sec].get(name, "auto") != "auto":
            try:
                parse_size(values[sec][name])
            except ValueError as exc:
                problems.append(f"{path}: {exc}")
    if values["output"].get("modbam") and values["pipeline"].get("methylation", CPG.name) != CPG.name:
        problems.append("output.modbam: modBAM carries CpG calls (C+m) only; leave it off with pipeline.methylation "
                        f"{values['pipeline']['methylation']}")
    if values["service"].get("metrics") is not None:
        from streamer.metrics import parse_address

        try:
            parse_address(values["service"]["metrics"])
        except ValueError as exc:
            problems.append(f"service.metrics: {exc}")
    for path in require:
        sec, name = path.split(".")
        if name not in values[sec] and not any(p.startswith(path + ":") for p in problems):
            flag = next(k for k in schema() if k.path == path)
            problems.append(f"{path}: required (set it in the file or with {flag.flag})")
    if len(problems) == 1:  # one line
        raise ConfigError(f"{origin}: {problems[0]}")
    if problems:
        raise ConfigError("\n  ".join([f"{len(problems)} problems in {origin}:", *problems]))
    config = Config()
    for sec in _sections():
        config = replace(config, **{sec.name: replace(getattr(config, sec.name), **values[sec.name])})
    return config


def load(path: Path | None, overrides: dict[str, Any] | None = None, *,
         require: tuple[str, ...] = REQUIRED_FOR_RUN) -> Config:
    """Defaults, then the file at `path` (if any), then `overrides` (`{"section.key": value}`)."""
    problems: list[str] = []
    flat = flatten(read_file(path), problems) if path is not None else {}
    flat.update(overrides or {})
    origin = f"{path} and the command line" if path is not None and overrides else str(path or "the command line")
    return build(flat, origin=origin, require=require, problems=problems)


# ---------------------------------------------------------------------------- command-line flags


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per key; a flag left out leaves the file's (or the default) value."""
    for sec in _sections():
        group = parser.add_argument_group(f"{sec.name} (config section `{sec.name}`)")
        for key in (k for k in schema() if k.path.startswith(sec.name + ".")):
            names = [key.short, key.flag] if key.short else [key.flag]
            kwargs: dict[str, Any] = {"dest": key.path, "default": argparse.SUPPRESS, "help": _flag_help(key)}
            if key.type is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif key.type is tuple:
                kwargs["action"] = "append"
                kwargs["metavar"] = key.path.split(".")[1].upper().removesuffix("S")
            else:
                kwargs["type"] = key.type
                kwargs["metavar"] = key.path.split(".")[1].upper()
                if key.choices:
                    kwargs["choices"] = key.choices
            group.add_argument(*names, **kwargs)


def _flag_help(key: Key) -> str:
    default = "" if key.default is None else f" [{_plain(key.default)}]"
    return f"{key.help}{default}".replace("%", "%%")


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The `{"section.key": value}` pairs the command line set."""
    paths = {k.path for k in schema()}
    return {k: v for k, v in vars(args).items() if k in paths}
