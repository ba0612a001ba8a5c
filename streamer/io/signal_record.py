"""One read's raw signal and calibration: what every format's reader gives and the batches take.

Apart from the readers, so that the pipeline and each format can name it without importing a
format's library (h5py, pod5 and pyarrow, pyslow5), which a run imports only for the formats it opens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class SignalRecord:
    """One read's raw ADC signal and the channel calibration that turns it into pA."""

    read_id: str
    raw: np.ndarray  # int16 ADC samples
    digitisation: float
    offset: float
    range: float
    sample_rate: float

    def to_pa(self) -> np.ndarray:
        """Picoamperes as float32, rounded exactly as f5c rounds them.

        f5c reads the calibration attributes as float32, forms `range / digitisation`
        once in float32 and then computes `(raw + offset) * raw_unit` per sample in
        float32; events downstream depend on these exact bits.
        """
        raw_unit = np.float32(self.range) / np.float32(self.digitisation)
        pa = self.raw.astype(np.float32)
        pa += np.float32(self.offset)
        pa *= raw_unit
        return pa
