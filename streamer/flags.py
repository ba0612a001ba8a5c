"""Numeric command-line flags with a range, checked as they are parsed: one line naming the flag,
exit status 2. Commands take the range from the configuration schema (`commands._checks.numeric`);
plugin commands give theirs here."""

from __future__ import annotations

import argparse
from typing import Any

from streamer.errors import UsageError


def bounded(p: argparse.ArgumentParser | Any, *names: str, type: type, minimum: float | None = None,
            key: str | None = None, **kwargs: Any) -> argparse.Action:
    """A flag of `type` (int or float) at least `minimum`; `key` names the config key it mirrors."""
    if type not in (int, float):
        raise TypeError(f"{names}: a numeric flag needs int or float, not {type}")
    return p.add_argument(*names, action=_Bounded, value_type=type, minimum=minimum, key=key,
                          metavar=kwargs.pop("metavar", "N" if type is int else "X"), **kwargs)


class _Bounded(argparse.Action):
    """Converts and checks the value as it is parsed: one line naming the flag, exit 2."""

    def __init__(self, option_strings, dest, *, value_type: type, minimum: float | None, key: str | None, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.value_type, self.minimum, self.key = value_type, minimum, key

    def __call__(self, parser, namespace, values, option_string=None):
        flag = "/".join(self.option_strings)
        try:
            value = self.value_type(values)
        except ValueError:
            kind = "an integer" if self.value_type is int else "a number"
            raise UsageError(f"{flag}: expected {kind}, got {values!r}") from None
        if self.value_type is float and value != value or value in (float("inf"), float("-inf")):
            raise UsageError(f"{flag}: expected a finite number, got {values!r}")
        if self.minimum is not None and value < self.minimum:
            same = f" (as config key {self.key})" if self.key else ""
            raise UsageError(f"{flag}: must be at least {self.minimum:g}{same}, got {values}")
        setattr(namespace, self.dest, value)
