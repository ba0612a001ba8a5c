"""The daemon's pipeline for the pore of the reads it is given, told from their signal files.

A daemon may start before its run has written a signal file, so the pore (a chemistry of
`streamer.pipeline.chemistry`, which picks the models) is not always known when the kernels are
warmed: `PorePipeline` builds the pipeline for the pore the watched folder already shows (or the
default one), and when a batch's signal files name another pore it builds that pore's pipeline in
place of the first, once, with one log line (files naming the default's pore keep the default's
pipeline). The sample rate (4 or 5 kHz R10.4.1) is each read's own, from its file. With a fixed
pore (`pipeline.pore` other than auto) it never changes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from streamer.pipeline.batch import ReadBatch, ReadInput
from streamer.errors import StreamerError
from streamer.pipeline.gpu import CudaOptions
from streamer.io.signal import SIGNAL_SUFFIXES
from streamer.pipeline.stages import BatchResult, Pipeline
from streamer.pipeline.chemistry import DEFAULT, chemistry, pore_of_file, title

log = logging.getLogger(__name__)

MakePipeline = Callable[[str | None, str, CudaOptions | None], Pipeline]
"""(pore, where it was told from, the GPU options the tuner last set or None) -> a warm pipeline."""


def first_signal_file(folder: Path) -> Path | None:
    """A signal file already in a watched folder (hidden folders passed over), or None."""
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and name.lower().endswith(SIGNAL_SUFFIXES):
                return Path(root) / name
    return None


class PorePipeline:
    """`front`, `run_batch` and `process` as `Pipeline`'s, on the pipeline of the batch's pore.

    For the tuner it stands for the GPU stage (`options`, `retune`) of whichever pipeline is
    current, so a pipeline built later starts from the settings the tuner has reached. The driver's
    front thread runs ahead of the compute threads, so a batch's front stages run only where the batch
    is sure to compute on a pipeline of the same pore: its files name the current pore (`run_batch`
    takes the pipeline of that pore, built again if another came between), or the pore is fixed.
    Batches whose files do not say go through every stage on the compute threads.
    """

    def __init__(self, make: MakePipeline, pore: str | None, source: str, *, follow: bool):
        self._make = make
        self.follow = follow  # False: the configured pore, whatever the files say
        self.pore = pore
        self._pore_of: dict[str, str | None] = {}
        self._lock = threading.Lock()  # the pipeline and its pore change together
        self.current: Pipeline | None = make(pore, source, None)
        self._cuda = self.current.gpu.options if self.current.gpu is not None else None

    @property
    def gpu(self):
        return self.current.gpu if self.current is not None else None

    @property
    def devices(self) -> list:
        """The current pipeline's GPUs (`Pipeline.devices`): how many batches may run at once."""
        return self.current.devices if self.current is not None else []

    @property
    def options(self) -> CudaOptions | None:
        return self._cuda

    def retune(self, options: CudaOptions) -> None:
        self._cuda = options
        if self.gpu is not None:
            self.gpu.retune(options)

    def front(self, batch: ReadBatch) -> None:
        """`Pipeline.front` where the batch's files name the current pore, or the pore is fixed; else nothing."""
        with self._lock:
            current, pore = self.current, self.pore
        if current is None or (self.follow and (pore is None or self._pore(batch.signal_paths) != pore)):
            return
        current.front(batch)

    def run_batch(self, batch: ReadBatch) -> BatchResult:
        return self._for(batch.signal_paths).run_batch(batch)

    def process(self, reads: list[ReadInput]) -> BatchResult:
        return self._for([r.signal_path for r in reads]).process(reads)

    def _for(self, paths: list[str]) -> Pipeline:
        """The pipeline of these reads' pore, built if it is not the current one."""
        if self.follow and paths:
            self._switch_to(paths)
        with self._lock:
            if self.current is None:  # building the last pore's pipeline failed: try again, to say why again
                self.current = self._make(self.pore, "the run's metadata", self._cuda)
            return self.current

    def _pore(self, paths: list[str]) -> str | None:
        """The pore the reads' files name (None: they say nothing); more than one stops the batch."""
        told = self._told(paths)
        pores = {pore for pore, _ in told}
        if len(pores) > 1:  # the daemon then takes the batch read by read
            raise StreamerError(f"one batch holds reads of pores {' and '.join(sorted(pores))}")
        return next(iter(pores), None)

    def _told(self, paths: list[str]) -> set[tuple[str, str]]:
        for path in set(paths) - self._pore_of.keys():
            self._pore_of[path] = pore_of_file(path) if path else None
        return {(pore, path) for path in set(paths) if (pore := self._pore_of[path])}

    def _switch_to(self, paths: list[str]) -> None:
        """The pipeline of the reads' pore; files whose metadata says nothing keep the current one."""
        pore = self._pore(paths)
        with self._lock:
            if pore is None or (pore == self.pore and self.current is not None):
                return
            path = min(p for told, p in self._told(paths) if told == pore)
            if self.current is not None and self.pore is None and chemistry(pore) is DEFAULT:
                log.info("%s: the run is %s", path, title(pore))  # the default's pipeline is that pore's
                self.pore = pore
                return
            log.info("%s: the run is %s: loading its models", path, title(pore))
            self.current = None  # its GPU memory goes before the next pipeline takes its share
            self.pore = pore
            self.current = self._make(pore, f"{path}'s run metadata", self._cuda)
