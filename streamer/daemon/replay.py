"""Re-enact a finished run into a live folder, the way MinKNOW writes one.

Reads are ordered by the time their signal ended and cut into batches, which land on the
pace `streamer.daemon.replay_plan` sets (the recorded one scaled, or Mbases/s). Each batch
becomes a multi-read FAST5 in `fast5_pass/` (or a POD5 in `pod5_pass/`, a BLOW5 in
`blow5_pass/`), a FASTQ in `fastq_pass/` and, when the finished run has an aligned BAM, a
BAM in `bam_pass/`, all named
`{flowcell}_pass_{run8}_{acq8}_{i}.*`. Files are written elsewhere and moved in (live
basecalling) or written in place, optionally slowly, so the watcher's completeness checks
are exercised. A `sequencing_summary` and then the `final_summary` (with its file counts) close
the run.

The finished run's signal may be FAST5, POD5 or BLOW5; its flow cell and kit (which tell the
pore) go into every signal file written. FAST5 reads keep their recorded times; POD5 and BLOW5
reads, whose files need not say when they were sequenced, are taken one after the other in file
order, each lasting its signal's length. A FAST5 replay copies HDF5 groups, so it needs FAST5
sources.
"""

from __future__ import annotations

import gzip
import logging
import multiprocessing
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np
import pysam
import vbz_h5py_plugin  # noqa: F401  (importing registers the VBZ filter with HDF5)

from streamer.errors import InputError
from streamer.io.pod5 import write_pod5
from streamer.io.poretype import run_metadata
from streamer.io.signal import iter_signal, read_signal
from streamer.io.slow5 import write_blow5
from streamer.daemon.replay_plan import BatchTiming, Landing, Pace, ReplayOptions, follow, plan
from streamer.daemon.runfolder import Kind, RunLayout

log = logging.getLogger(__name__)

VBZ = {"compression": 32020, "compression_opts": (0, 2, 1, 1)}
COMPRESSION = {"vbz": VBZ, "gzip": {"compression": "gzip", "compression_opts": 1}, "none": {}}
STAGING = ".replay"  # hidden, so a watcher of the live folder ignores it
RECORD_WRITERS = {"pod5": write_pod5, "blow5": write_blow5}  # FAST5 copies HDF5 groups: `Replayer._write_fast5`
SIGNAL_FORMATS = ("fast5", *RECORD_WRITERS)


@dataclass(frozen=True)
class SourceRead:
    """Where one read of the finished run is, and when it was sequenced."""

    read_id: str
    signal_file: Path
    group: str  # HDF5 path of its raw group: /Raw/Reads/Read_N (single) or /read_<id> (multi); "" for POD5/BLOW5
    single: bool
    channel: str
    start_s: float
    end_s: float


@dataclass
class Source:
    """A finished run: its reads, basecalls and (optional) aligned BAM records."""

    reads: list[SourceRead]
    basecalls: dict[str, tuple[str, str | None]]  # read id -> (sequence, quality)
    bam_header: pysam.AlignmentHeader | None = None
    bam_records: dict[str, list[pysam.AlignedSegment]] = field(default_factory=dict)
    run_id: str = ""
    device: str = "MN00000"
    run_info: dict[str, str] = field(default_factory=dict)  # flow cell and kit, as `run_metadata` reads them


def load_source(root: Path) -> Source:
    """Find the signal, basecall and BAM files of a finished run (any layout the daemon reads)."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(root, "no such folder")
    layout = RunLayout(root, basecalls="fastq")
    files = sorted(Path(d) / f for d, _, fs in os.walk(root, followlinks=True) for f in fs)
    reads: list[SourceRead] = []
    basecalls: dict[str, tuple[str, str | None]] = {}
    src = Source(reads, basecalls)
    for path in files:
        rf = layout.classify(path)
        if path.suffix == ".bam":
            _load_bam(path, src)
        elif rf is None:
            continue
        elif rf.kind is Kind.SIGNAL:
            src.run_info = src.run_info or run_metadata(path)
            reads.extend(_fast5_reads(path, src) if rf.fmt == "fast5" else _record_reads(path, reads))
        elif rf.kind is Kind.BASECALLS:
            with pysam.FastxFile(str(path)) as fh:
                for rec in fh:
                    basecalls.setdefault(rec.name, (rec.sequence, rec.quality))
    for rid, recs in src.bam_records.items():
        if rid not in basecalls:
            primary = next((r for r in recs if not (r.is_secondary or r.is_supplementary)), None)
            if primary is not None and primary.query_sequence:
                qual = pysam.qualities_to_qualitystring(primary.query_qualities) if primary.query_qualities else None
                basecalls[rid] = (primary.get_forward_sequence(), qual[::-1] if qual and primary.is_reverse else qual)
    if not reads:
        raise InputError(root, "no signal files found")
    reads.sort(key=lambda r: (r.end_s, r.read_id))
    src.run_id = src.run_id or uuid.uuid4().hex
    return src


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _fast5_reads(path: Path, src: Source) -> Iterator[SourceRead]:
    try:
        with h5py.File(path, "r") as f:
            if "Raw/Reads" in f:
                cal = f["UniqueGlobalKey/channel_id"].attrs
                tracking = f["UniqueGlobalKey/tracking_id"].attrs if "UniqueGlobalKey/tracking_id" in f else {}
                src.run_id = src.run_id or _text(tracking.get("run_id", ""))
                src.device = _text(tracking.get("device_id", src.device)) or src.device
                for name, g in f["Raw/Reads"].items():
                    yield _source_read(path, f"/Raw/Reads/{name}", True, g.attrs, cal)
            else:
                for name in f:
                    if name.startswith("read_"):
                        g = f[name]
                        src.run_id = src.run_id or _text(g.attrs.get("run_id", ""))
                        yield _source_read(path, f"/{name}", False, g["Raw"].attrs, g["channel_id"].attrs)
    except (OSError, KeyError) as exc:
        raise InputError(path, f"cannot read FAST5: {exc}") from exc


def _record_reads(path: Path, before: list[SourceRead]) -> Iterator[SourceRead]:
    """A POD5 or BLOW5 file's reads, one after the other from where the reads found so far end."""
    t = max((r.end_s for r in before), default=0.0)
    try:
        for rec in iter_signal(path):
            duration = len(rec.raw) / rec.sample_rate
            yield SourceRead(rec.read_id, path, "", False, "1", t, t + duration)
            t += duration
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the format libraries raise their own types
        raise InputError(path, f"cannot read signal file: {exc}") from exc


def _source_read(path: Path, group: str, single: bool, raw_attrs, cal) -> SourceRead:
    rate = float(cal["sampling_rate"])
    start = int(raw_attrs.get("start_time", 0))
    duration = int(raw_attrs.get("duration", 0))
    return SourceRead(_text(raw_attrs["read_id"]), path, group, single, _text(cal.get("channel_number", "0")),
                      start / rate, (start + duration) / rate)


def _load_bam(path: Path, src: Source) -> None:
    try:
        with pysam.AlignmentFile(str(path), "rb", check_sq=False) as fh:
            if fh.nreferences == 0:
                log.info("%s: unaligned BAM; its basecalls are used, no BAM is replayed", path)
            else:
                src.bam_header = src.bam_header or fh.header
            for rec in fh.fetch(until_eof=True):
                src.bam_records.setdefault(rec.query_name, []).append(rec)
    except (OSError, ValueError) as exc:
        raise InputError(path, f"cannot read BAM: {exc}") from exc
    if src.bam_header is None:
        src.bam_records.clear()


# ---------------------------------------------------------------------------- writing


class Replayer:
    """Writes the planned files into `live`; `run()` blocks until the final_summary is written."""

    def __init__(self, src: Source, live: Path, opts: ReplayOptions, *, started: datetime | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        if opts.mode not in ("move", "inplace"):
            raise ValueError(f"mode must be move or inplace, not {opts.mode!r}")
        if opts.signal_format not in SIGNAL_FORMATS:
            raise ValueError(f"signal format must be one of {', '.join(SIGNAL_FORMATS)}, not {opts.signal_format!r}")
        if opts.signal_format == "fast5" and any(r.group == "" for r in src.reads):
            raise InputError(src.reads[0].signal_file, "the run's signal is not FAST5: replay it as pod5 or blow5")
        self.src = src
        self.opts = opts
        self._sleep = sleep
        self._clock = clock
        self.started = started = started or datetime.now(timezone.utc)
        self.run8 = src.run_id[:8]
        self.acq8 = uuid.uuid5(uuid.NAMESPACE_URL, src.run_id).hex[:8]
        name = f"{started:%Y%m%d_%H%M}_{src.device}_{opts.flowcell}_{self.run8}"
        self.run_dir = Path(live) / name
        self.batches = [src.reads[i : i + opts.batch_reads] for i in range(0, len(src.reads), opts.batch_reads)]
        t0 = min(r.start_s for r in src.reads)
        self.timings = [BatchTiming(b[-1].end_s - t0, sum(len(src.basecalls.get(r.read_id, ("",))[0]) for r in b))
                        for b in self.batches]  # fmt: skip
        self.bam = opts.bam and src.bam_header is not None
        self.pace: Pace | None = None  # once run

    def stem(self, i: int) -> str:
        return f"{self.opts.flowcell}_pass_{self.run8}_{self.acq8}_{i}"

    def dest(self, batch: int, kind: str) -> Path:
        """Where batch `batch`'s file of `kind` (signal, fastq, bam) lands."""
        fmt = self.opts.signal_format
        sub, ext = {"signal": (f"{fmt}_pass", fmt), "fastq": ("fastq_pass", "fastq.gz"), "bam": ("bam_pass", "bam")}[kind]
        return self.run_dir / sub / f"{self.stem(batch)}.{ext}"

    def closing(self) -> tuple[Path, Path]:
        """The sequencing summary and the final summary, written in this order after every batch."""
        tail = f"{self.opts.flowcell}_{self.run8}_{self.acq8}.txt"
        return self.run_dir / f"sequencing_summary_{tail}", self.run_dir / f"final_summary_{tail}"

    def run(self, workers: int = 1) -> Path:
        """Land every file on the pace, then the summaries; `workers` > 1 (a replay as fast as it can write, as
        staging is) writes the batch files in that many processes at once."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        landings = plan(self.timings, self.opts, self.bam)
        t0 = self._clock()
        try:
            if workers > 1:
                self._land_all(landings, workers)
            else:
                follow(landings, self._land, t0, sleep=self._sleep, clock=self._clock)
            sequencing, final = self.closing()
            self._write_text(sequencing, self._sequencing_summary())
            self._write_text(final, self._final_summary())
        finally:
            shutil.rmtree(self.run_dir / STAGING, ignore_errors=True)
        self.pace = Pace.kept(self.timings, landings, self._clock() - t0)
        return self.run_dir

    def _land_all(self, landings: list[Landing], workers: int) -> None:
        """Each landing written at once in a pool of forked processes, which share the source as it is
        (its BAM records do not pickle); a replay that keeps a pace lands in order on its clock instead."""
        if any(landing.at > 0 for landing in landings):  # the plan keeps a pace
            raise ValueError("files are written by several processes only in a replay as fast as it can write")
        fork = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=fork, initializer=_adopt, initargs=(self,)) as pool:
            list(pool.map(_land_adopted, landings))

    def _land(self, landing: Landing) -> None:
        reads = self.batches[landing.batch]
        dest = self.dest(landing.batch, landing.kind)
        with self._placing(dest) as tmp:
            if landing.kind == "fastq":
                self._write_fastq(tmp, reads)
            elif landing.kind == "bam":
                self._write_bam(tmp, reads)
            elif self.opts.signal_format == "fast5":
                self._write_fast5(tmp, reads)
            else:
                RECORD_WRITERS[self.opts.signal_format](tmp, (read_signal(r.signal_file, r.read_id) for r in reads),
                                                        self.src.run_info)  # fmt: skip
        log.info("replayed %s (%d reads)", dest, len(reads))

    @contextmanager
    def _placing(self, dest: Path):
        """Yield where to write: the destination (in place) or a staging file moved there after."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        if self.opts.mode == "inplace":
            yield dest
            return
        staging = self.run_dir / STAGING
        staging.mkdir(exist_ok=True)
        tmp = staging / dest.name
        yield tmp
        os.replace(tmp, dest)

    def _pace(self, n_parts: int) -> Callable[[], None]:
        """A pause to take between the parts of a file written slowly in place."""
        pause = self.opts.write_seconds / max(1, n_parts) if self.opts.mode == "inplace" else 0.0
        return (lambda: self._sleep(pause)) if pause > 0 else (lambda: None)

    def _write_text(self, dest: Path, text: str) -> None:
        with self._placing(dest) as tmp:
            tmp.write_text(text)

    def _write_fast5(self, path: Path, reads: list[SourceRead]) -> None:
        pause = self._pace(len(reads))
        comp = COMPRESSION[self.opts.compression]
        with h5py.File(path, "w") as out:
            out.attrs["file_version"] = np.bytes_("2.2")
            out.attrs["file_type"] = np.bytes_("multi-read")
            for r in reads:
                with h5py.File(r.signal_file, "r") as f:
                    g = out.create_group(f"read_{r.read_id}")
                    g.attrs["run_id"] = np.bytes_(self.src.run_id)
                    raw_src = f[r.group] if r.single else f[r.group]["Raw"]
                    raw = g.create_group("Raw")
                    for k, v in raw_src.attrs.items():
                        raw.attrs[k] = v
                    raw.create_dataset("Signal", data=raw_src["Signal"][()], **comp)
                    meta = "/UniqueGlobalKey" if r.single else r.group
                    for name in ("channel_id", "context_tags", "tracking_id"):
                        if f"{meta}/{name}" in f:
                            f.copy(f[f"{meta}/{name}"], g, name)
                out.flush()
                pause()

    def _write_fastq(self, path: Path, reads: list[SourceRead]) -> None:
        pause = self._pace(len(reads))
        with gzip.GzipFile(path, "wb", mtime=0) as fh:  # no time in the header: the same reads, the same bytes
            for n, r in enumerate(reads):
                bc = self.src.basecalls.get(r.read_id)
                if bc is None:
                    continue
                seq, qual = bc
                qual = qual or "5" * len(seq)
                started = datetime.fromtimestamp(self.started.timestamp() + r.start_s, timezone.utc)
                fh.write(f"@{r.read_id} runid={self.src.run_id} read={n} ch={r.channel} "
                         f"start_time={started.isoformat(timespec='seconds')}\n{seq}\n+\n{qual}\n".encode())
                fh.flush()
                pause()

    def _write_bam(self, path: Path, reads: list[SourceRead]) -> None:
        pause = self._pace(len(reads))
        with pysam.AlignmentFile(str(path), "wb", header=self.src.bam_header) as out:
            for r in reads:
                for rec in self.src.bam_records.get(r.read_id, []):
                    out.write(rec)
                pause()

    def _sequencing_summary(self) -> str:
        lines = ["filename_fastq\tfilename_fast5\tread_id\trun_id\tchannel\tstart_time\tduration\t"
                 "passes_filtering\tsequence_length_template\n"]
        for i, batch in enumerate(self.batches):
            for r in batch:
                n = len(self.src.basecalls.get(r.read_id, ("",))[0])
                lines.append(f"{self.stem(i)}.fastq.gz\t{self.stem(i)}.{self.opts.signal_format}\t{r.read_id}\t{self.src.run_id}\t"
                             f"{r.channel}\t{r.start_s:.4f}\t{r.end_s - r.start_s:.4f}\tTRUE\t{n}\n")
        return "".join(lines)

    def _final_summary(self) -> str:
        """MinKNOW's keys, with as many files of each kind as the replay wrote (a BLOW5 replay names its own)."""
        n = len(self.batches)
        stopped = datetime.now(timezone.utc).isoformat(timespec="seconds")
        fmt = self.opts.signal_format
        counts = {"fast5": 0, "pod5": 0, fmt: n, "fastq": n, "bam": n if self.bam else 0}
        files = "".join(f"{k}_files_in_final_dest={v}\n{k}_files_in_fallback=0\n" for k, v in counts.items())
        return (f"instrument={self.src.device}\nflow_cell_id={self.opts.flowcell}\nprotocol_run_id={self.src.run_id}\n"
                f"started={self.started.isoformat(timespec='seconds')}\nacquisition_stopped={stopped}\n"
                f"processing_stopped={stopped}\nbasecalling_enabled=1\n"
                f"sequencing_summary_file={self.closing()[0].name}\n{files}")


_ADOPTED: list[Replayer] = []  # the replayer a pool's process writes for (`Replayer._land_all`)


def _adopt(replayer: Replayer) -> None:
    _ADOPTED.append(replayer)


def _land_adopted(landing: Landing) -> None:
    _ADOPTED[0]._land(landing)
