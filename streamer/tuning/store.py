"""Learned settings per GPU, kept in the state folder for the next start: `tuning.json`.

One JSON object, `{"version": 1, "devices": {KEY: {"settings": {...}, "closed": [...], ...}}}`,
keyed by the GPU's name and memory (`GpuInfo.key`), so one state folder can serve several
machines. `closed` holds the directions a measured loss closed (`Closure`), so a restart does
not pay for the same lesson again. A file that cannot be read or parsed is reported and
ignored: learned values are an optimisation.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from streamer.pipeline.gpu import GpuInfo
from streamer.tuning.knobs import INTEGER_KNOBS, KNOBS, Closure, Settings

log = logging.getLogger(__name__)

FILE = "tuning.json"
VERSION = 1


class TuningStore:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / FILE

    def load(self, gpu: GpuInfo) -> dict[str, Any]:
        """The settings learned on this GPU (positive numbers of known knobs only), or {}."""
        record = self._read().get("devices", {}).get(gpu.key, {})
        settings = record.get("settings", {}) if isinstance(record, dict) else {}
        if not isinstance(settings, dict):
            return {}
        out: dict[str, Any] = {}
        for knob, value in settings.items():
            if knob in KNOBS and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                out[knob] = int(value) if knob in INTEGER_KNOBS else float(value)
        return out

    def load_closed(self, gpu: GpuInfo) -> list[Closure]:
        """The directions closed on this GPU; entries that do not parse are dropped."""
        record = self._read().get("devices", {}).get(gpu.key, {})
        out = []
        for entry in record.get("closed", []) if isinstance(record, dict) else []:
            try:
                out.append(Closure.from_dict(entry))
            except (KeyError, TypeError, ValueError):
                log.warning("%s: a closed tuning direction not read (%r)", self.path, entry)
        return out

    def save(self, gpu: GpuInfo, settings: Settings, changes: int, closed: Iterable[Closure] = ()) -> None:
        """Record this GPU's settings and closed directions, keeping other devices' records; written atomically."""
        data = self._read()
        devices = data.get("devices") if isinstance(data.get("devices"), dict) else {}
        devices[gpu.key] = {"settings": settings.as_dict(), "changes": changes,
                            "closed": [{k: v for k, v in c.as_dict().items() if k != "kind"} for c in closed],
                            "name": gpu.name,
                            "total_bytes": gpu.total_bytes,
                            "updated": datetime.now(timezone.utc).isoformat(timespec="seconds")}  # fmt: skip
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tuning-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump({"version": VERSION, "devices": devices}, fh, indent=2)
                fh.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("%s: learned tuning values not read (%s); starting from the profile", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("version") != VERSION:
            log.warning("%s: not a tuning file of version %d; starting from the profile", self.path, VERSION)
            return {}
        return data
