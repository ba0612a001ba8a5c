"""POD5 signal reading (the `pod5` package) into the `SignalRecord` the FAST5 reader gives.

Calibration: POD5 keeps a float32 `offset` and `scale = range / digitisation` per read, and
the ADC span (`adc_min`, `adc_max`) per run. The record carries
`digitisation = adc_max - adc_min + 1` (what MinKNOW and `pod5 convert fast5` write) and
`range = scale * digitisation`, which gives back the stored `scale` bit for bit in
`SignalRecord.to_pa()`, so the pA values are `(raw + offset) * scale` in float32: the same
bits as pod5's own `signal_pa` and, for a file written from a FAST5 file, as f5c's
`(raw + offset) * (range / digitisation)` on that FAST5. The one caveat: the POD5 writer
forms `range / digitisation` in double precision and rounds once to float32, f5c divides
in float32; when `digitisation` is a power of two (every MinION, GridION and PromethION
file: 8192 or 2048) both are exact, otherwise they may differ in the last bit.

Robustness: POD5 has no checksums, so a damaged compressed signal can decode to wrong
samples without any error. What is checked: the signature at both ends (a file still
being written or cut short has no trailing signature), full validation of every Arrow
table before use (corrupt offsets would otherwise crash the process inside Arrow), and
that each decoded signal has the length the read table states. Every failure surfaces
as `InputError` naming the file (and read).

The `pod5` package (and with it pyarrow) is imported as the first file is opened, not with this
module: a run whose signal is all FAST5 or BLOW5 never loads them.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from streamer.errors import InputError, reading
from streamer.io.signal_record import SignalRecord

if TYPE_CHECKING:
    import pod5

log = logging.getLogger(__name__)

SIGNATURE = b"\x8bPOD\r\n\x1a\n"
LIBRARIES = ("pod5",)  # imported as the first file is opened (pyarrow with it)


def pod5_is_complete(path: str | Path) -> bool:
    """True once a POD5 file ends with its signature (writers add it when they close)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SIGNATURE))
            fh.seek(0, 2)
            if fh.tell() < 2 * len(SIGNATURE):
                return False
            fh.seek(-len(SIGNATURE), 2)
            return head == SIGNATURE and fh.read() == SIGNATURE
    except OSError:
        return False


def pod5_read_ids(path: str | Path) -> list[str]:
    """Read ids held by a POD5 file, in file order."""
    import pod5

    with _open(path) as reader:
        try:
            return [
                rid
                for i in range(reader.batch_count)
                for rid in pod5.format_read_ids(reader.read_table.get_batch(i).column("read_id"))
            ]
        except Exception as exc:
            raise InputError(path, f"cannot list reads ({exc})") from exc


def iter_pod5(path: str | Path) -> Iterator[SignalRecord]:
    """Yield every read of a POD5 file; the file stays open only while iterating."""
    with _open(path) as reader:
        yield from _records(path, reader.reads())


def read_pod5(path: str | Path, read_id: str) -> SignalRecord:
    """Load one read by id (the file's read-id lookup, not a scan of the signal)."""
    for rec in read_pod5_many(path, [read_id]):
        return rec
    raise InputError(path, "read not found in this POD5 file", read_id=read_id)


def read_pod5_many(path: str | Path, read_ids: Iterable[str]) -> Iterator[SignalRecord]:
    """Yield the named reads that the file holds, in file order, opening the file once."""
    with _open(path) as reader:
        yield from _records(path, reader.reads(selection=list(read_ids), missing_ok=True))


CONTEXT_TAGS = ("experiment_kit", "experiment_type", "sequencing_kit")
"""Run keys a FAST5 keeps in `context_tags` (the others in `tracking_id`); POD5's run info has both."""


def write_pod5(path: str | Path, records: Iterable[SignalRecord], run: Mapping[str, str] | None = None) -> int:
    """Write reads to a new POD5 file with the official writer; returns how many.

    Calibration and ADC span are set as `pod5 convert fast5` sets them, so a FAST5 read
    written here reads back with the same pA bits. `run` sets string fields of the run
    info (e.g. `flow_cell_product_code`, `sequencing_kit`, which tell the pore); its other keys
    go where a FAST5 keeps them, in the run info's `context_tags` (the kit and experiment type)
    or `tracking_id` (the rest, such as `exp_script_name`), so a FAST5 run written here names its
    pore as the source did. For tests, benchmarks and replays; read ids must be UUIDs, as POD5
    requires.
    """
    import pod5

    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    runs: dict[tuple[int, int], pod5.RunInfo] = {}
    n = 0
    with pod5.Writer(path, software_name="streamer") as writer:
        for rec in records:
            key = (int(rec.sample_rate), int(rec.digitisation))
            if key not in runs:
                adc_min = -4096 if key[1] == 8192 else 0
                fields = dict(
                    acquisition_id=f"streamer-{key[0]}hz-{key[1]}", acquisition_start_time=epoch,
                    adc_max=adc_min + key[1] - 1, adc_min=adc_min, context_tags={}, experiment_name="",
                    flow_cell_id="", flow_cell_product_code="", protocol_name="", protocol_run_id="",
                    protocol_start_time=epoch, sample_id="", sample_rate=key[0], sequencing_kit="",
                    sequencer_position="", sequencer_position_type="", software="streamer", system_name="",
                    system_type="", tracking_id={},
                )
                rest = {k: v for k, v in (run or {}).items() if k not in fields}
                fields.update({k: v for k, v in (run or {}).items() if k in fields},
                              context_tags={k: v for k, v in rest.items() if k in CONTEXT_TAGS},
                              tracking_id={k: v for k, v in rest.items() if k not in CONTEXT_TAGS})
                runs[key] = pod5.RunInfo(**fields)
            writer.add_read(pod5.Read(
                read_id=uuid.UUID(rec.read_id),
                pore=pod5.Pore(channel=1, well=1, pore_type="not_set"),
                calibration=pod5.Calibration.from_range(rec.offset, rec.range, rec.digitisation),
                read_number=n,
                start_sample=0,
                median_before=float("nan"),
                end_reason=pod5.EndReason(pod5.EndReasonEnum.UNKNOWN, False),
                run_info=runs[key],
                signal=rec.raw,
            ))
            n += 1
    return n


@contextmanager
def _open(path: str | Path) -> Iterator[pod5.Reader]:
    import pod5

    _check_signatures(path)
    try:
        reader = pod5.Reader(path)
    except Exception as exc:
        raise InputError(path, f"cannot open as POD5 ({exc})") from exc
    try:
        _validate(path, reader)
        yield reader
    finally:
        reader.close()


def _check_signatures(path: str | Path) -> None:
    with reading(path, "POD5"):
        with open(path, "rb") as fh:
            if fh.read(len(SIGNATURE)) != SIGNATURE:
                raise InputError(path, "not a POD5 file (no POD5 signature at the start)")
            size = fh.seek(0, 2)
            if size >= 2 * len(SIGNATURE):
                fh.seek(-len(SIGNATURE), 2)
            if size < 2 * len(SIGNATURE) or fh.read() != SIGNATURE:
                raise InputError(path, "truncated POD5 file (no closing signature: incomplete copy, or still being written)")


_VALIDATED: set[tuple[str, int, int]] = set()  # file versions (path, size, mtime) validated in this process
_VALIDATED_LOCK = threading.Lock()
_VALIDATED_MOST = 10_000


def _validate(path: str | Path, reader: pod5.Reader) -> None:
    """Full Arrow validation of every table: offsets and lengths are checked before use.

    Once per file version and process: the reader tasks of a batch open a file once per task, and
    validating its whole tables each time cost more than decoding the task's reads."""
    with reading(path, "POD5"):
        st = os.stat(path)
    version = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if version in _VALIDATED:
        return
    _validate_tables(path, reader)
    with _VALIDATED_LOCK:
        if len(_VALIDATED) >= _VALIDATED_MOST:  # a long-running daemon: forget the oldest run's files
            _VALIDATED.clear()
        _VALIDATED.add(version)


def _validate_tables(path: str | Path, reader: pod5.Reader) -> None:
    import pyarrow as pa  # loaded by pod5 already

    for name in ("read_table", "run_info_table", "signal_table"):
        try:
            table = getattr(reader, name)
            for i in range(table.num_record_batches):
                table.get_batch(i).validate(full=True)
        except (pa.ArrowException, OSError, RuntimeError, ValueError) as exc:
            raise InputError(path, f"corrupt POD5 {name.replace('_', ' ')} ({exc})") from exc


def _records(path: str | Path, reads: Iterator[pod5.ReadRecord]) -> Iterator[SignalRecord]:
    while True:
        read_id = None
        try:
            rec = next(reads, None)
            if rec is None:
                return
            read_id = str(rec.read_id)
            signal_record = _record(path, rec, read_id)
        except InputError:
            raise
        except Exception as exc:  # pod5 raises many types (RuntimeError, KeyError, Arrow errors)
            raise InputError(path, f"unreadable read ({exc})", read_id=read_id) from exc
        yield signal_record


def _record(path: str | Path, rec: pod5.ReadRecord, read_id: str) -> SignalRecord:
    raw = rec.signal
    if len(raw) != rec.num_samples:
        raise InputError(path, f"signal has {len(raw)} samples, the read table says {rec.num_samples}", read_id=read_id)
    run = rec.run_info
    offset, scale = np.float32(rec.calibration.offset), np.float32(rec.calibration.scale)
    if not (np.isfinite(offset) and np.isfinite(scale) and scale > 0 and run.sample_rate > 0):
        raise InputError(path, f"invalid calibration (offset {offset}, scale {scale}, sample rate {run.sample_rate})", read_id=read_id)
    digitisation = float(run.adc_max - run.adc_min + 1)
    range_ = float(scale) * digitisation
    if digitisation < 2 or np.float32(range_) / np.float32(digitisation) != scale:
        log.debug("%s: read %s: ADC span %s does not reproduce scale %s; using digitisation 1",
                  path, read_id, digitisation, scale)
        digitisation, range_ = 1.0, float(scale)
    return SignalRecord(
        read_id=read_id,
        raw=raw,
        digitisation=digitisation,
        offset=float(offset),
        range=range_,
        sample_rate=float(run.sample_rate),
    )
