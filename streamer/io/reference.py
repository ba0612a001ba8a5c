"""Reference sequences: random access through a FASTA index, or held in memory.

Plain or bgzip-compressed FASTA is read through htslib's faidx (building the `.fai`
when it can); a plain-gzip FASTA cannot be indexed and is loaded into memory once.
One `Reference` may serve several threads at once (the daemon's runs assemble their batches
each on its own thread): faidx's handle seeks and reads a shared file position, so its reads
take turns on a lock, or one thread's span would come back with another's bases. A batch's spans
are read together (`spans`): a few windows, each one read, rather than one read per record.
"""

from __future__ import annotations

import gzip
import logging
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pysam

from streamer.errors import InputError

log = logging.getLogger(__name__)

TELL_IN_MEMORY_BYTES = 64 << 20  # a compressed FASTA this large costs real memory held whole (a human one: ~3 GB)
SPAN_GAP = 1 << 10  # spans further apart are read in windows of their own: at most this is read in vain a span


class Spans(NamedTuple):
    """Many spans' bases: span i's are `length[i]` bytes of `text` from `at[i]`, upper-case ASCII."""

    text: np.ndarray  # uint8
    at: np.ndarray  # int64
    length: np.ndarray  # int64: end - start, fewer where the contig ends first


class Reference:
    """`fetch(name, start, end)` returns upper-case reference bases, 0-based half-open."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(self.path, "reference FASTA not found")
        self._faidx: pysam.FastaFile | None = None
        self._reading = threading.Lock()  # faidx's reads, one at a time (see the module's docstring)
        self._seqs: dict[str, str] = {}
        quiet = pysam.set_verbosity(0)  # htslib would print its own errors for plain gzip
        try:
            self._faidx = pysam.FastaFile(str(self.path))
        except (OSError, ValueError):
            self._load_in_memory()
        finally:
            pysam.set_verbosity(quiet)

    def _load_in_memory(self) -> None:
        with open(self.path, "rb") as fh:
            opener = gzip.open if fh.read(2) == b"\x1f\x8b" else open
        size = self.path.stat().st_size
        say = log.info if size >= TELL_IN_MEMORY_BYTES else log.debug  # a bacterial genome loads in a blink
        say("%s cannot be indexed (plain gzip?): loading it into memory (bgzip it to read it through an index)",
            self.path)
        name, parts = None, []
        try:
            with opener(self.path, "rt") as fh:
                for line in fh:
                    if line.startswith(">"):
                        if name is not None:
                            self._seqs[name] = "".join(parts).upper()
                        name, parts = line[1:].split()[0], []
                    else:
                        parts.append(line.strip())
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise InputError(self.path, f"cannot read reference: {exc}") from exc
        if name is not None:
            self._seqs[name] = "".join(parts).upper()
        if not self._seqs:
            raise InputError(self.path, "no sequences in reference FASTA")

    @property
    def names(self) -> list[str]:
        return list(self._faidx.references) if self._faidx is not None else list(self._seqs)

    def length(self, name: str) -> int:
        if self._faidx is not None:
            return self._faidx.get_reference_length(name)
        return len(self._seqs[name])

    def fetch(self, name: str, start: int, end: int) -> str:
        try:
            if self._faidx is not None:
                with self._reading:
                    seq = self._faidx.fetch(name, start, end)
                return seq.upper()
            return self._seqs[name][start:end]
        except KeyError:
            raise InputError(self.path, f"contig {name!r} is not in the reference") from None

    def spans(self, name: str, starts: np.ndarray, ends: np.ndarray, gap: int = SPAN_GAP) -> Spans:
        """The bases of spans [starts[i], ends[i]) of contig `name`, as `fetch` gives them, read in windows:
        spans that overlap or lie within `gap` of each other share one, so a batch of a sorted BAM's
        records takes a read or two, and far-apart spans do not pull in what lies between."""
        starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
        first = np.ones(len(s), np.bool_)
        first[1:] = s[1:] > np.maximum.accumulate(e)[:-1] + gap
        heads = np.flatnonzero(first)
        w_start = s[heads]
        w_end = np.maximum.reduceat(e, heads) if len(heads) else heads
        texts = [self.fetch(name, int(a), int(b)).encode("ascii") for a, b in zip(w_start, w_end)]
        w_len = np.fromiter(map(len, texts), np.int64, len(texts))
        w_at = np.zeros(len(texts), np.int64)
        np.cumsum(w_len[:-1], out=w_at[1:])
        w = np.cumsum(first) - 1  # each sorted span's window
        at, length = np.empty(len(s), np.int64), np.empty(len(s), np.int64)
        at[order] = w_at[w] + (s - w_start[w])
        length[order] = np.clip(np.minimum(e, w_start[w] + w_len[w]) - s, 0, None)
        return Spans(np.frombuffer(b"".join(texts), np.uint8), at, length)

    def close(self) -> None:
        if self._faidx is not None:
            self._faidx.close()

    def __enter__(self) -> "Reference":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
