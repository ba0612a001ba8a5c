"""The user's folders streamer keeps things in when not told where: caches (rebuilt at will),
state (learned values) and data (model files). XDG base directories, as desktop and service
users expect."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def user_cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """`$XDG_CACHE_HOME/streamer`, by default `~/.cache/streamer`."""
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "streamer"


def user_state_dir(env: Mapping[str, str] = os.environ) -> Path:
    """`$XDG_STATE_HOME/streamer`, by default `~/.local/state/streamer`."""
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "streamer"


def user_data_dir(env: Mapping[str, str] = os.environ) -> Path:
    """`$XDG_DATA_HOME/streamer`, by default `~/.local/share/streamer`."""
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "share")
    return Path(base) / "streamer"
