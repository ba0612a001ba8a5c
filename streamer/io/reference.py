"""Reference sequences: random access through a FASTA index, or held in memory.

Plain or bgzip-compressed FASTA is read through htslib's faidx (building the `.fai`
when it can); a plain-gzip FASTA cannot be indexed and is loaded into memory once.
One `Reference` may serve several threads at once (the daemon's runs assemble their batches
each on its own thread): faidx's handle seeks and reads a shared file position, so its reads
take turns on a lock, or one thread's span would come back with another's bases.
"""

from __future__ import annotations

import gzip
import logging
import threading
from pathlib import Path

import pysam

from streamer.errors import InputError

log = logging.getLogger(__name__)

TELL_IN_MEMORY_BYTES = 64 << 20  # a compressed FASTA this large costs real memory held whole (a human one: ~3 GB)


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

    def close(self) -> None:
        if self._faidx is not None:
            self._faidx.close()

    def __enter__(self) -> "Reference":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
