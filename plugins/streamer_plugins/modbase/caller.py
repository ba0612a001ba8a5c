"""Pass thresholds and the per-position call, as modkit 0.4.4 makes them.

Probabilities are (ML + 0.5) / 256 in float32 and the canonical probability is 1 minus their
sum. A class is a candidate when its probability reaches its threshold (a code's own
`--mod-threshold`, then one given for the primary base's letter, then the base's
`--filter-threshold`, then the default); the most probable candidate is the call, canonical
winning a tie; no candidate is a failed call. `--no-filtering` is every threshold at 0.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from streamer.errors import ConfigError

BASES = "ACGT"
FAIL = -1  # call index of a failed call; otherwise an index into codes, len(codes) is canonical


@dataclass(frozen=True)
class Thresholds:
    """Pass thresholds: a default, per primary base (0..3) and per mod code."""

    default: float = 0.0
    per_base: dict[int, float] = field(default_factory=dict)
    per_mod: dict[str, float] = field(default_factory=dict)

    def for_base(self, base: int) -> np.float32:
        return np.float32(self.per_base.get(base, self.default))

    def for_code(self, code: str, base: int) -> np.float32:
        value = self.per_mod.get(code, self.per_mod.get(BASES[base]))
        return self.for_base(base) if value is None else np.float32(value)


def parse_filter_thresholds(raw: list[str], mod_thresholds: list[str] | None) -> Thresholds:
    """`--filter-threshold` values (`0.8`, `C:0.7`, repeatable) and `--mod-threshold` (`h:0.8`)."""
    default: float | None = None
    per_base: dict[int, float] = {}
    for item in raw:
        if ":" in item:
            base, _, value = item.partition(":")
            if base not in BASES:
                raise ConfigError(f"--filter-threshold {item}: {base!r} is not a base (A, C, G or T)")
            if BASES.index(base) in per_base:
                raise ConfigError(f"--filter-threshold: repeated threshold for base {base}")
            per_base[BASES.index(base)] = _number(value, "--filter-threshold", item)
        else:
            if default is not None:
                raise ConfigError("--filter-threshold: default threshold given more than once")
            default = _number(item, "--filter-threshold", item)
    return Thresholds(default or 0.0, per_base, parse_mod_thresholds(mod_thresholds))


def parse_mod_thresholds(raw: list[str] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in raw or []:
        code, sep, value = item.partition(":")
        if not sep or not code:
            raise ConfigError(f"--mod-threshold {item}: should be CODE:THRESHOLD, e.g. h:0.8")
        out[normalise_code(code)] = _number(value, "--mod-threshold", item)
    return out


def normalise_code(code: str) -> str:
    """A mod code as written in bedMethyl: a single character, or a ChEBI number without leading zeros."""
    if len(code) == 1:
        return code
    if code.isdigit():
        return str(int(code))
    raise ConfigError(f"{code!r} is not a modification code (one letter or a ChEBI number)")


def _number(text: str, option: str, item: str) -> float:
    try:
        return float(np.float32(text))
    except ValueError:
        raise ConfigError(f"{option} {item}: {text!r} is not a number") from None


def canonical_probability(probs: np.ndarray) -> np.ndarray:
    """1 - sum of the present mod probabilities, float32."""
    return np.float32(1) - np.nansum(probs, axis=1, dtype=np.float32)


_FX_SEED = 0x517CC1B727220A95
_MASK64 = (1 << 64) - 1


def _fx_hash(code: str) -> int:
    """rustc-hash 1.1's FxHasher over modkit's ModCodeRepr (enum discriminant, then the char or ChEBI number)."""
    h = 0
    for word in ((0, ord(code)) if not code.isdigit() else (1, int(code))):
        h = ((((h << 5) | (h >> 59)) & _MASK64) ^ word) * _FX_SEED & _MASK64
    return h


@functools.lru_cache(maxsize=256)
def hash_order(codes: tuple[str, ...]) -> tuple[int, ...]:
    """Indices of `codes` (in insertion order) in the order modkit's hash map of them iterates.

    Among mod classes of equal probability modkit's call is the last one its map yields, so
    this replays hashbrown's slot choice (16-byte control groups, power-of-two buckets).
    """
    slots: list[int | None] = []
    for i in range(len(codes)):
        capacity = len(slots) - 1 if len(slots) <= 8 else len(slots) // 8 * 7
        if i + 1 > capacity:
            n = max(i + 1, capacity + 1)
            buckets = (4 if n < 4 else 8) if n < 8 else 1 << (n * 8 // 7 - 1).bit_length()
            old = [j for j in slots if j is not None]
            slots = [None] * buckets
            for j in old:
                _insert(slots, j, codes)
        _insert(slots, i, codes)
    return tuple(j for j in slots if j is not None)


def _insert(slots: list, i: int, codes) -> None:
    mask = len(slots) - 1
    pos = _fx_hash(codes[i]) & mask
    stride = 0
    while True:
        group = [slots[(pos + k) & mask] if pos + k <= mask or len(slots) >= 16 else None for k in range(16)]
        free = [k for k, v in enumerate(group) if v is None]
        if free:
            at = (pos + free[0]) & mask
            if slots[at] is not None:  # small table: the group ran past the end
                at = next(k for k, v in enumerate(slots) if v is None)
            slots[at] = i
            return
        stride += 16
        pos = (pos + stride) & mask


def call_positions(probs: np.ndarray, codes: tuple[str, ...], base: int, thresholds: Thresholds) -> np.ndarray:
    """Call index per position: FAIL, a code's index, or len(codes) for canonical."""
    n, k = probs.shape
    canonical = canonical_probability(probs)
    limits = np.array([thresholds.for_code(c, base) for c in codes], dtype=np.float32)
    scores = np.where(probs >= limits, probs, -np.inf) if k else np.zeros((n, 0), np.float32)
    # among equal mod probabilities the last one in modkit's map order wins
    order = np.array(hash_order(codes), dtype=np.int64)[::-1]
    best = order[np.argmax(scores[:, order], axis=1)] if k else np.zeros(n, np.int64)
    best_score = scores[np.arange(n), best] if k else np.full(n, -np.inf)
    can_ok = canonical >= thresholds.for_base(base)
    out = np.where(best_score > -np.inf, best, FAIL)
    out = np.where(can_ok & (canonical >= best_score), k, out)
    return out.astype(np.int64)


def argmax_probability(probs: np.ndarray) -> np.ndarray:
    """Probability of the most likely class per position (what the threshold is estimated from)."""
    canonical = canonical_probability(probs)
    if probs.shape[1] == 0:
        return canonical
    best = np.nanmax(np.where(np.isnan(probs), -np.inf, probs), axis=1).astype(np.float32)
    return np.where(best > canonical, best, canonical).astype(np.float32)


def percentile(values: np.ndarray, q: float) -> float:
    """Linearly interpolated quantile in float32, as modkit computes it (at least two values)."""
    xs = np.sort(values.astype(np.float32))
    if len(xs) < 2:
        raise ConfigError(f"cannot estimate a pass threshold from {len(xs)} call(s); give --filter-threshold or --no-filtering")
    q32 = np.float32(q)
    if q32 == np.float32(1):
        return float(xs[-1])
    lq = np.float32(len(xs) - 1) * q32
    left, right = int(np.floor(lq)), int(np.ceil(lq))
    g = lq - np.float32(np.floor(lq))
    return float(xs[left] * (np.float32(1) - g) + xs[right] * g)


def ignore_code(codes: tuple[str, ...], probs: np.ndarray, code: str) -> tuple[tuple[str, ...], np.ndarray]:
    """`--ignore CODE`: the code's probability shared equally among the other classes present."""
    if code not in codes:
        return codes, probs
    j = codes.index(code)
    # modkit rebuilds the map in its old iteration order
    order = [i for i in hash_order(tuple(codes)) if i != j]
    codes, probs = tuple(codes[i] for i in order) + (code,), probs[:, order + [j]]
    j = len(codes) - 1
    marginal = np.nan_to_num(probs[:, j], nan=0.0).astype(np.float32)
    rest = np.delete(probs, j, axis=1)
    share = marginal / (np.sum(~np.isnan(rest), axis=1).astype(np.float32) + np.float32(1))
    return codes[:j] + codes[j + 1:], (rest + share[:, None]).astype(np.float32)
