"""The run metadata a signal file carries, which tells its pore chemistry.

MinKNOW records the flow cell product code and the sequencing kit (FAST5 `tracking_id` /
`context_tags`, POD5 run info, SLOW5/BLOW5 header), and the experiment type (`rna` for direct RNA); which chemistry those strings name is
each chemistry's own description (`streamer.pipeline.chemistry`). A format's library is imported
as a file of that format is read, as the signal readers do.
"""

from __future__ import annotations

import re
from pathlib import Path

from streamer.io.signal import signal_format

_KEYS = ("flow_cell_product_code", "sequencing_kit", "exp_script_name", "experiment_kit", "experiment_type")
_SLOW5_HEADER = re.compile(rb"@(" + "|".join(_KEYS).encode() + rb")\t([^\n]*)")
_SLOW5_HEADER_BYTES = 1 << 20


def _attrs(group) -> dict[str, str]:
    return {k: str(v.decode() if isinstance(v, bytes) else v) for k, v in group.attrs.items() if k in _KEYS}


def _fast5_metadata(path: Path) -> dict[str, str]:
    import h5py

    with h5py.File(path, "r") as f:
        top = f["UniqueGlobalKey"] if "UniqueGlobalKey" in f else next((f[k] for k in f if k.startswith("read_")), None)
        if top is None:
            return {}
        return {k: v for sub in ("tracking_id", "context_tags") if sub in top for k, v in _attrs(top[sub]).items()}


def _pod5_metadata(path: Path) -> dict[str, str]:
    import pod5

    with pod5.Reader(path) as reader:
        read = next(reader.reads(), None)
        if read is None:
            return {}
        info = read.run_info
        tags = {k: v for group in (info.tracking_id, info.context_tags) for k, v in dict(group).items() if k in _KEYS}
        return {**tags, "flow_cell_product_code": info.flow_cell_product_code, "sequencing_kit": info.sequencing_kit}


def _slow5_metadata(path: Path) -> dict[str, str]:
    with open(path, "rb") as fh:
        head = fh.read(_SLOW5_HEADER_BYTES)
    found = {m.group(1).decode(): m.group(2).decode(errors="replace") for m in _SLOW5_HEADER.finditer(head)}
    return {k: v for k, v in found.items() if v != "."}  # "." is SLOW5's empty field


_READERS = {"fast5": _fast5_metadata, "pod5": _pod5_metadata, "blow5": _slow5_metadata, "slow5": _slow5_metadata}


def run_metadata(path: str | Path) -> dict[str, str]:
    """The flow cell and kit fields a signal file's run carries (those of them it has, non-empty);
    empty if it has none or cannot be read (the signal readers report a bad file when its reads are
    read). A replay writes them into the files it makes, so they tell the pore as the source did."""
    path = Path(path)
    try:
        return {k: v for k, v in _READERS[signal_format(path)](path).items() if v}
    except Exception:  # noqa: BLE001 - h5py, pod5 and OS errors alike mean "not known"
        return {}

