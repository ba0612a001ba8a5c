"""`streamer run`: the daemon. Watch a run folder (or several) and call methylation as its files land."""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import signal
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import yaml

from streamer import config as configuration
from streamer import registry
from streamer.align.engine import SeedAligner
from streamer.daemon.aligner import ReadAligner, open_aligner
from streamer.daemon.shell import PARSE_WORKERS, Daemon, PipelineLike
from streamer.daemon.runs import RunSet, check_publishing, made_once, several_runs
from streamer.errors import ConfigError, ModelError, StreamerError
from streamer.pipeline import timeline
from streamer.pipeline.gpu import CudaOptions
from streamer.io.alignments import AlignmentFilter
from streamer.io.reference import Reference
from streamer.io.signal import SIGNAL_SUFFIXES, reader_libraries
from streamer.daemon.journal import check_output_free
from streamer.metrics import serve_metrics
from streamer.daemon.notify import Notifier
from streamer.pipeline.stages import Pipeline, PipelineOptions
from streamer.daemon.pore_pipeline import PorePipeline, first_signal_file
from streamer.pipeline.chemistry import chemistry, pore_models, pore_of_file
from streamer.pore.motifs import motif
from streamer.publish.publisher import Publisher, PublisherConfig
from streamer.publish.security import CurveServer, load_public_keys, load_secret_keys
from streamer.sinks import warm_up
from streamer.tuning.profiles import CACHED_BYTES_PER_BASE, Plan, budget_bytes, cache_bases, memory_plan, parse_size
from streamer.tuning.session import AutoTuner, plan_config

NAME = "run"
HELP = "watch a run folder, or several, and call methylation on reads as their files land (the daemon)"

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="YAML configuration (see config/streamer.yaml); flags override it")
    p.add_argument("--trace", type=Path, metavar="FILE",
                   help="also write the daemon's timeline (each landed file's intake; each batch's basecalls, reading, "
                        "stages and commit; by thread) as a "
                        f"Chrome trace when it stops, for Perfetto: its first {TRACE_SPANS:,} spans")
    configuration.add_flags(p)


TRACE_SPANS = 1_000_000  # about 200 MB held at most: a run's first hours


def run(args: argparse.Namespace) -> int:
    if args.trace:
        timeline.start(TRACE_SPANS)
    try:
        return _run(args)
    finally:
        if args.trace:
            timeline.write(args.trace)


def _run(args: argparse.Namespace) -> int:
    cfg, plan = budgeted(*plan_config(configuration.load(args.config, configuration.overrides_from(args))))
    if several_runs(cfg):
        check_publishing(cfg)
    check_output_free(cfg.output.dir)
    log.debug("configuration:\n%s", yaml.safe_dump(cfg.as_dict(), sort_keys=False).rstrip())
    notifier = Notifier()
    filt = AlignmentFilter(min_mapq=cfg.alignment.min_mapq, secondary=cfg.alignment.secondary)
    threads = cfg.pipeline.threads

    def make_aligner() -> ReadAligner | SeedAligner:
        return open_aligner(cfg.alignment.engine, cfg.reference.genome, filt, index=cfg.reference.index,
                            preset=cfg.reference.preset, threads=threads)

    with ExitStack() as stack:
        stack.callback(notifier.close)
        first = " for this machine (first run only)" if getattr(args, "compiling_kernels", False) else ""
        notifier.status(f"loading models and compiling kernels{first}")
        pipeline = _pore_pipeline(cfg)
        reference = stack.enter_context(Reference(cfg.reference.genome))
        publisher = None
        if cfg.publish.endpoint and not several_runs(cfg):
            publisher = stack.enter_context(_publisher(cfg.publish))
        gpu = pipeline if pipeline.gpu is not None else None  # it stands for the current pipeline's GPU stage
        if several_runs(cfg):
            # the tuner learns from one stream of batches: with several runs the caps stay as configured
            aligner = made_once(make_aligner)

            def make_daemon(run_cfg: configuration.Config, shared: PipelineLike) -> Daemon:
                # each run its own stream: its run id, sequences and snapshots (docs/protocol.md)
                pub = stack.enter_context(_publisher(run_cfg.publish)) if run_cfg.publish.endpoint else None
                return Daemon(run_cfg, shared, reference, make_aligner=aligner, publisher=pub,
                              published_on=bound_addresses(pub), profile=plan.as_dict())

            gpus = len({device.dev_id for device in pipeline.devices})
            slots = cfg.pipeline.compute_threads * max(1, gpus)  # as one run's batches overlap
            daemon = RunSet(cfg, pipeline, make_daemon, notifier, slots=slots)
        else:
            tuner = AutoTuner.for_gpu(plan, gpu, autotune=cfg.gpu.autotune, state_dir=cfg.state_dir(),
                                      publish=publisher.publish_tuning if publisher is not None else None)
            daemon = Daemon(cfg, pipeline, reference, make_aligner=make_aligner, publisher=publisher,
                            notifier=notifier, tuner=tuner, published_on=bound_addresses(publisher),
                            profile=plan.as_dict())
        if cfg.service.metrics is not None:
            stack.callback(serve_metrics(cfg.service.metrics, lambda: daemon.status))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _: daemon.request_stop(signal.Signals(signum).name))
        if isinstance(daemon, Daemon):  # its state and outputs opened, their kernels loaded, before the heap settles
            daemon.start()
        settle()
        code = daemon.run()
        # a stop asked for while closing changes nothing; left to the handler, the interpreter's exit
        # restores the default action and a late SIGTERM would turn a clean finish into death by signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if daemon.abandoned:  # the batch in hand is still computing; the ledger has not got it
            logging.shutdown()
            os._exit(code)
        daemon.close()
    return code


def budgeted(cfg: configuration.Config, plan: Plan) -> tuple[configuration.Config, Plan]:
    """The daemon's batch cap B, compute threads and reader kind within `pipeline.memory_budget` (`auto`: the
    profile's), as `streamer call` sizes its own batches in flight, beside its basecall cache (bounded within
    its share of the budget); on a Jetson the GPU part's share of the budget too (`gpu.memory`). The plan
    comes back with the budget and that share."""
    threads = cfg.pipeline.threads or os.cpu_count() or 1
    budget = budget_bytes(cfg.pipeline.memory_budget, plan.profile, threads)
    pending = cache_bases(budget, cfg.join.max_pending_bases)
    # its signal readers and the processes that read its landed files; a batch's bytes a base as the CPU's (at
    # B 3.6M the GPU box's daemon held 3.2 GB where `streamer call` holds 2.5: its file parsers, its sinks' tables)
    memory = memory_plan(budget, cfg.batch.max_bases, cfg.pipeline.compute_threads, threads + PARSE_WORKERS,
                         cfg.pipeline.io_mode,
                         plan.device_share(cuda_options(cfg)), held=pending * CACHED_BYTES_PER_BASE)  # fmt: skip
    if memory.max_bases < cfg.batch.max_bases:
        log.debug("batches of at most %d bases to keep within the memory budget of %d MB", memory.max_bases,
                 memory.budget >> 20)
    plan = plan.budgeted(memory)
    return replace(cfg, batch=replace(cfg.batch, max_bases=memory.max_bases),
                   join=replace(cfg.join, max_pending_bases=pending),
                   pipeline=replace(cfg.pipeline, io_mode=memory.io_mode, compute_threads=memory.compute_threads),
                   gpu=replace(cfg.gpu, memory=plan.gpu.memory)), plan


def _pore_pipeline(cfg: configuration.Config) -> PorePipeline:
    """The pipeline of `pipeline.pore` or, with `auto`, of the pore the watched folder's signal files
    name (built again for the other pore if later files name it)."""
    pore, source = cfg.pipeline.pore, f"pipeline.pore {cfg.pipeline.pore}"
    if pore == "auto":
        first = first_signal_file(cfg.watch.dir) if cfg.watch.dir is not None else None
        pore, source = (pore_of_file(first), f"{first}'s run metadata") if first is not None else (None, "")

    def make(pore: str | None, source: str, cuda: CudaOptions | None) -> Pipeline:
        kmer_model, meth_model, calls = model_files(cfg.pipeline, pore, source)
        # eventalign before the CpG caller, which fails the reads it finds no CpG in
        analyses = [registry.analysis("eventalign", cfg.eventalign.scale_events)] if cfg.eventalign.enabled else []
        options = PipelineOptions(threads=cfg.pipeline.threads, kmer_model=kmer_model, meth_model=meth_model,
                                  cuda=cuda or cuda_options(cfg), chemistry=chemistry(pore),
                                  motif=motif(cfg.pipeline.methylation))  # fmt: skip
        pipeline = Pipeline(options, [*analyses, registry.analysis("cpg", calls=calls)])
        warm_up(cfg, pipeline.warm_up_result)  # the TSV kernel too, before the run's first batch
        return pipeline

    return PorePipeline(make, pore, source, follow=cfg.pipeline.pore == "auto")


def model_files(p: configuration.PipelineConfig, pore: str | None,
                source: str) -> tuple[Path | None, Path | None, bool]:
    """The model files of the pore (`source` says where it was told from), and whether methylation is
    called. A missing R10.4.1 nucleotide table, or a motif the pore has no model for, is a configuration
    error (exit 78: a restart would not find it either); without the CpG model file, one line says so and
    the rest (eventalign) goes on."""
    try:
        kmer, _ = pore_models(pore, p.kmer_model, p.meth_model, p.model_dir, methylation=False)
    except ModelError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        return kmer, pore_models(pore, p.kmer_model, p.meth_model, p.model_dir, motif=motif(p.methylation))[1], True
    except ModelError as exc:
        log.warning("%s: %s; no methylation calls, the outputs that need none are written", source, exc)
        return kmer, None, False
    except StreamerError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def cuda_options(cfg: configuration.Config) -> CudaOptions:
    """The GPU keys as the pipeline takes them (`gpu.disable_hmm` is `streamer call --disable-cuda-hmm`);
    `auto` left unresolved (no device profile planned) is no reserve, ordinary streams and events on the CPU."""
    g = cfg.gpu
    return CudaOptions(disable=g.disable, mem_frac=g.mem_frac, avg_epk=g.avg_epk, max_lf=g.max_lf,
                       max_epk=g.max_epk, ultra_thresh=g.ultra_thresh, max_reads=cfg.batch.max_reads,
                       max_bases=cfg.batch.max_bases, hmm=not g.disable_hmm, events=bool(g.events),
                       autotune=g.autotune, reserve=0 if g.reserve == "auto" else parse_size(g.reserve),
                       memory_cap=None if g.memory is None else parse_size(g.memory),
                       stream_priority="normal" if g.stream_priority == "auto" else g.stream_priority,
                       lanes=cfg.pipeline.compute_threads).with_devices(g.device)  # fmt: skip


def bound_addresses(publisher: Publisher | None) -> dict | None:
    """Where a publisher listens (ports the system chose included), as summary.json says it."""
    if publisher is None:
        return None
    return {"endpoints": list(publisher.endpoints), "snapshot": publisher.snapshot_endpoint}


def _publisher(p: configuration.PublishConfig) -> Publisher:
    curve = None
    if p.curve_secret_key is not None:
        clients = load_public_keys([p.curve_clients]) if p.curve_clients is not None else frozenset()
        curve = CurveServer(load_secret_keys(p.curve_secret_key), clients)
    return Publisher(publisher_config(p, curve))


def publisher_config(p: configuration.PublishConfig, curve: CurveServer | None = None) -> PublisherConfig:
    return PublisherConfig(endpoints=(p.endpoint, *p.extra_endpoints), snapshot_endpoint=p.snapshot_endpoint,
                           sndhwm=p.send_hwm, heartbeat_interval=p.heartbeat_interval, curve=curve,
                           insecure_bind=p.insecure_bind)


def settle() -> None:
    """Before the daemon takes files: the signal readers' libraries imported (pod5's import held the GIL for
    0.8 s of a GPU box's first batches, on a compute thread), and what the start-up made (numba's types and
    dispatchers, the models, the kernels' modules: most of the heap, kept for the process's life) left out of
    the collector's full passes. Each walked it all holding the GIL, 100-180 ms at a time on a GPU box at
    24 Mbases/s, while the batches' threads waited (`benchmarks/RESULTS-cpu-half.md`)."""
    for library in reader_libraries(SIGNAL_SUFFIXES):
        importlib.import_module(library)
    gc.collect()
    gc.freeze()
