"""Which Jetson board this is, from the files L4T (JetPack's Linux) leaves: the device profile's first clue.

A Jetson's GPU shares the host's memory, and its name through CUDA ("Orin") does not tell an
8 GB Orin Nano from a 64 GB AGX Orin; the device-tree model string does. `board_of` and
`jetson_profile` are pure, over the files' contents; `read_board` is the one that reads them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TEGRA_RELEASE = Path("/etc/nv_tegra_release")
MODEL_FILES = (Path("/proc/device-tree/model"), Path("/sys/firmware/devicetree/base/model"))
# L4T's major release from which only Orin boards are supported (R36 is JetPack 6)
ORIN_ONLY_RELEASE = 36
GIB = 2**30


@dataclass(frozen=True)
class Board:
    """A Jetson: its device-tree model ("NVIDIA Jetson AGX Orin Developer Kit"), or "" where the
    tree has none, and its L4T release ("R36.3.0") where /etc/nv_tegra_release names it."""

    model: str
    release: str | None = None

    @property
    def release_major(self) -> int | None:
        return int(self.release[1:].split(".")[0]) if self.release else None

    def describe(self) -> str:
        """As the log, `streamer status` and the metrics name it: "NVIDIA Jetson ... Kit L4T R36.3.0"."""
        release = f"L4T {self.release}" if self.release else ""
        return f"{self.model or 'Jetson (model not named)'} {release}".strip()


def board_of(tegra_release: str | None, model: str | None) -> Board | None:
    """The board these contents describe (None: not a Jetson).

    tegra_release: /etc/nv_tegra_release ("# R36 (release), REVISION: 3.0, GCID: ..."), None if absent;
    model: the device-tree model, NUL-terminated as the kernel writes it, None if absent. Either one
    is enough: the release file is L4T's own; a model naming a Jetson, or NVIDIA's Tegra SoCs
    (Orin, Xavier), holds where the release file was not installed (some containers).
    """
    name = " ".join((model or "").replace("\x00", " ").split())
    release = None
    if tegra_release is not None:
        m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", tegra_release)
        release = f"R{m.group(1)}.{m.group(2)}" if m else None
    lower = name.lower()
    soc = "nvidia" in lower and re.search(r"orin|xavier|tegra", lower)
    if tegra_release is None and not ("jetson" in lower or soc):
        return None
    return Board(name, release)


def read_board(release_file: Path = TEGRA_RELEASE, model_files: Sequence[Path] = MODEL_FILES) -> Board | None:
    """This machine's board, from the files (paths given for tests); None off a Jetson."""
    model = next((text for text in map(_read, model_files) if text is not None), None)
    return board_of(_read(release_file), model)


def jetson_profile(name: str, memory_bytes: int, release_major: int | None = None) -> str:
    """The `jetson-*` profile for a board or GPU name ("NVIDIA Jetson Orin Nano Developer Kit", "Orin",
    "NVIDIA Tegra X2") and its memory (shared by CPU and GPU): the name first, the memory where the
    name does not tell; an unnamed board on L4T R36 or later is an Orin."""
    lower = " ".join(re.sub(r"[-_]", " ", name.lower()).split())
    gib = memory_bytes / GIB
    if "orin" in lower or (release_major or 0) >= ORIN_ONLY_RELEASE:
        if "nano" in lower:
            return "jetson-orin-nano"
        if re.search(r"\bnx\b", lower):
            return "jetson-orin-nx"
        if "agx" in lower:
            return "jetson-orin"
        return "jetson-orin-nano" if gib <= 8.5 else "jetson-orin-nx" if gib <= 16.5 else "jetson-orin"
    for word, profile in (("xavier", "jetson-xavier"), ("x2", "jetson-tx2"), ("x1", "jetson-nano"),
                          ("nano", "jetson-nano")):  # fmt: skip
        if word in lower:
            return profile
    for most, profile in ((4.5, "jetson-nano"), (8.5, "jetson-tx2"), (32.5, "jetson-xavier")):
        if gib <= most:
            return profile
    return "jetson-orin"


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
