"""What the code needs from Python 3.11+, for Python 3.10 (JetPack 6's Ubuntu 22.04 ships 3.10)."""

from __future__ import annotations

import enum

try:
    from enum import StrEnum  # novermin (3.10 takes the class below)
except ImportError:  # Python 3.10

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        """Members that are their values, in str() and formatting too (3.11's `enum.StrEnum`)."""

        __str__ = str.__str__
        __format__ = str.__format__


__all__ = ["StrEnum"]
