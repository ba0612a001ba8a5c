"""Pore models: expected current level per k-mer, loaded and checked once.

A model file has `#key value` header lines, then one row per k-mer in rank order:
`kmer level_mean level_stdv [sd_mean sd_stdv ...]`. Nucleotide models use the
alphabet ACGT (4^k rows); methylation models ACGMT, where M is the modified base of their
motif (5^k rows; `streamer.pore.motifs`). Ranks are base-|alphabet| numbers with the first base most significant.
Text models have k up to 9 (f5c's limit; f5c's R10.4.1 CpG 9-mer model is 1,953,125 rows),
the alphabet from `#alphabet` or, without it, from the presence of M (an RNA model's U is read as T); large ones are parsed once
and then read from a binary cache (`streamer.pore.modeltext`). uncalled4's `.npz` level tables (ONT's
R10.4.1 400bps 9-mer, MIT; 5.6 MB) load into the same `PoreModel`. Neither R10.4.1 model is
shipped: `streamer.pipeline.chemistry` looks for them in a per-pore folder and says where to get a missing one.
"""

from __future__ import annotations

import hashlib
import math
import os
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numba
import numpy as np

from streamer.pore import modeltext
from streamer.pore.motifs import MOTIFS
from streamer.errors import ModelError
from streamer.paths import user_data_dir

NUCLEOTIDE = "ACGT"
METHYL_CPG = "ACGMT"

DEFAULT_KMER_MODEL = "r9.4_450bps.nucleotide.6mer.template.model"
DEFAULT_METH_MODEL = "r9.4_450bps.cpg.6mer.template.model"
MAX_TEXT_K = 9  # as f5c (MAX_KMER_SIZE): 5^9 CpG rows
_ALPHABETS = {"nucleotide": NUCLEOTIDE, "u_to_t_rna": NUCLEOTIDE, **dict.fromkeys(MOTIFS, METHYL_CPG)}
_NPZ_KEYS = ("_k", "kmer", "current.mean", "current.stdv", "_pa_mean", "_pa_stdv")

# Base -> digit lookup tables indexed by ASCII code; -1 marks a letter outside the alphabet.
NUC_CODE = np.full(256, -1, dtype=np.int8)
for _i, _b in enumerate(NUCLEOTIDE):
    NUC_CODE[ord(_b)] = _i
METH_CODE = np.full(256, -1, dtype=np.int8)
for _i, _b in enumerate(METHYL_CPG):
    METH_CODE[ord(_b)] = _i


@dataclass(frozen=True)
class PoreModel:
    """Level means and standard deviations of one pore model, indexed by k-mer rank."""

    name: str
    k: int
    alphabet: str
    level_mean: np.ndarray  # float32[n_kmers]
    level_stdv: np.ndarray  # float32[n_kmers]
    level_log_stdv: np.ndarray  # float32[n_kmers], single-precision log(level_stdv), as f5c caches it

    @property
    def n_kmers(self) -> int:
        return len(self.level_mean)

    @property
    def codes(self) -> np.ndarray:
        """ASCII -> digit table for this model's alphabet."""
        return METH_CODE if self.alphabet == METHYL_CPG else NUC_CODE


@numba.njit(nogil=True, cache=True)
def logf(x):
    """Element-wise single-precision log (libm's logf, as f5c's C++ `log(float)` is).

    numpy's vectorised float32 log differs from logf in the last bit for about one
    model entry in eight, which shifts emission sums.
    """
    out = np.empty(len(x), dtype=np.float32)
    for i in range(len(x)):
        out[i] = math.log(np.float32(x[i]))
    return out


def _kmer_at_rank(rank: int, k: int, alphabet: str) -> str:
    n = len(alphabet)
    out = []
    for _ in range(k):
        out.append(alphabet[rank % n])
        rank //= n
    return "".join(reversed(out))


def load_npz_model(path: str | Path) -> PoreModel:
    """Read and validate an uncalled4 `.npz` level table (e.g. ONT's R10.4.1 400bps 9-mer).

    uncalled4 stores levels normalised to mean 0 and stdv 1 of the pA current, with the pA
    mean and stdv as `_pa_mean` and `_pa_stdv`; levels are turned back into pA so the model
    sits beside the r9 ones. Rows must be the 4^k k-mers of ACGT in rank order.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [key for key in _NPZ_KEYS if key not in z.files]
            if missing:
                raise ModelError(path, f"not an uncalled4 level table: no {missing[0]!r} array")
            k = int(z["_k"])
            kmers = np.asarray(z["kmer"])
            mean, stdv = z["current.mean"].astype(np.float64), z["current.stdv"].astype(np.float64)
            pa_mean, pa_stdv = float(z["_pa_mean"]), float(z["_pa_stdv"])
            name = str(z["_name"]) if "_name" in z.files else path.name
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ModelError(path, f"cannot read model file: {exc}") from exc
    n = len(NUCLEOTIDE) ** k
    if len(stdv) == 0 and len(mean) == n:  # uncalled4's RNA004 table: levels without their spread
        raise ModelError(path, "no level stdv (its 'current.stdv' is empty): give a table that has one")
    if not 1 <= k <= 15 or len(kmers) != n or len(mean) != n or len(stdv) != n:
        raise ModelError(path, f"{len(kmers)} rows, expected {len(NUCLEOTIDE)}^{k} = {n} for alphabet {NUCLEOTIDE}")
    letters = np.asarray(kmers, dtype=f"U{k}")
    digits = NUC_CODE[np.minimum(np.char.upper(letters).view(np.uint32).reshape(n, k), 255)].astype(np.int64)
    ranks = (digits * len(NUCLEOTIDE) ** np.arange(k - 1, -1, -1)).sum(axis=1)
    bad = np.flatnonzero((np.char.str_len(kmers) != k) | (digits < 0).any(axis=1) | (ranks != np.arange(n)))
    if bad.size:
        rank = int(bad[0])
        want = _kmer_at_rank(rank, k, NUCLEOTIDE)
        raise ModelError(path, f"k-mer {str(kmers[rank])!r} at row {rank} out of rank order (expected {want!r})")
    level_mean = (mean * pa_stdv + pa_mean).astype(np.float32)
    level_stdv = (stdv * pa_stdv).astype(np.float32)
    if not (np.isfinite(level_mean).all() and np.isfinite(level_stdv).all() and (level_stdv > 0).all()):
        raise ModelError(path, "levels must be finite with positive stdv")
    return PoreModel(name, k, NUCLEOTIDE, level_mean, level_stdv, logf(level_stdv))


def load_model(path: str | Path) -> PoreModel:
    """Read and validate a model file (text, or uncalled4 `.npz`); a malformed file raises
    ModelError naming file and line. Large text models come from the binary cache once built."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"PK":  # .npz is a zip archive
                return load_npz_model(path)
        cached = path.stat().st_size >= modeltext.CACHE_MIN_BYTES
        if cached and (arrays := modeltext.read_cached(modeltext.content_key(path))) is not None:
            if (model := _from_arrays(path.name, arrays)) is not None:
                return model
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(path, f"cannot read model file: {exc.strerror}") from exc
    model = _parse_text(path, data)
    if cached:
        modeltext.write_cached(hashlib.sha256(data).hexdigest(), path, {
            "k": np.int64(model.k), "alphabet": np.str_(model.alphabet), "level_mean": model.level_mean,
            "level_stdv": model.level_stdv, "level_log_stdv": model.level_log_stdv})  # fmt: skip
    return model


def _from_arrays(name: str, a: dict[str, np.ndarray]) -> PoreModel | None:
    """A model from cached arrays, or None if they do not hold a whole one."""
    try:
        k, alphabet = int(a["k"]), str(a["alphabet"])
        arrays = [a[key] for key in ("level_mean", "level_stdv", "level_log_stdv")]
    except (KeyError, ValueError, TypeError):
        return None
    if alphabet not in (NUCLEOTIDE, METHYL_CPG) or not 1 <= k <= 15:
        return None
    if any(x.dtype != np.float32 or x.shape != (len(alphabet) ** k,) for x in arrays):
        return None
    return PoreModel(name, k, alphabet, *arrays)


def _parse_text(path: Path, data: bytes) -> PoreModel:
    """Validate a nanopolish/f5c text model: `#k`, `#alphabet`, rows in rank order, positive stdv."""
    buf = np.frombuffer(data, np.uint8)
    kind, spans, n_fields = modeltext.scan_lines(buf)

    def field(line: int, i: int) -> str:
        return data[spans[line, 2 * i] : spans[line, 2 * i + 1]].decode(errors="replace")

    def row_text(line: int) -> str:
        return data[spans[line, 0] : spans[line, 2 * min(n_fields[line], 3) - 1]].decode(errors="replace")

    k_header = alphabet = None
    for line in np.flatnonzero((kind == modeltext.COMMENT) & (n_fields > 1)).tolist():
        key, value = field(line, 0), field(line, 1)
        if key == "#k":
            try:
                k_header = int(value)
            except ValueError:
                raise ModelError(path, f"invalid k-mer size {value!r}", line=line + 1) from None
        elif key == "#alphabet":
            alphabet = _ALPHABETS.get(value.lower())
            if alphabet is None:
                raise ModelError(path, f"alphabet {value!r} is not one streamer reads ({', '.join(_ALPHABETS)})",
                                 line=line + 1)  # fmt: skip
    rows = np.flatnonzero(kind == modeltext.ROW)
    if not rows.size:
        raise ModelError(path, "no k-mer rows")
    if (short := rows[n_fields[rows] < 3]).size:
        raise ModelError(path, "expected 'kmer level_mean level_stdv'", line=int(short[0]) + 1)
    klen = spans[rows, 1] - spans[rows, 0]
    k = int(klen[0])
    if k_header is not None and k_header != k:
        raise ModelError(path, f"header says k={k_header} but k-mers have length {k}", line=int(rows[0]) + 1)
    if (odd := rows[klen != k]).size:
        raise ModelError(path, f"k-mer {field(int(odd[0]), 0)!r} has length {len(field(int(odd[0]), 0))}, not {k}",
                         line=int(odd[0]) + 1)  # fmt: skip
    if not 1 <= k <= MAX_TEXT_K:
        raise ModelError(path, f"k={k} is beyond the largest supported k-mer size {MAX_TEXT_K}", line=int(rows[0]) + 1)
    letters = modeltext.gather_fields(buf, spans[rows, 0], spans[rows, 1], k)
    letters = np.where((letters >= 97) & (letters <= 122), letters - 32, letters)  # upper case
    letters = np.where(letters == ord("U"), ord("T"), letters)  # RNA models over U (f5c's RNA004 5-mer): U is T
    alphabet = alphabet or (METHYL_CPG if (letters == ord("M")).any() else NUCLEOTIDE)
    expected = len(alphabet) ** k
    if len(rows) != expected:
        raise ModelError(path, f"{len(rows)} rows, expected {len(alphabet)}^{k} = {expected} for alphabet {alphabet}")
    digits = (METH_CODE if alphabet == METHYL_CPG else NUC_CODE)[letters]  # int8, -1 outside the alphabet
    ranks = np.zeros(expected, np.int64)
    for j in range(k):  # column by column: no (rows, k) int64 temporary for 2 million rows
        ranks = ranks * len(alphabet) + digits[:, j]
    if (bad := np.flatnonzero((digits < 0).any(axis=1) | (ranks != np.arange(expected)))).size:
        r = int(bad[0])
        raise ModelError(path, f"k-mer {field(int(rows[r]), 0)!r} out of rank order (expected "
                         f"{_kmer_at_rank(r, k, alphabet)!r})", line=int(rows[r]) + 1)  # fmt: skip
    levels = []
    for col in (1, 2):
        values, bad_at = modeltext.parse_column(buf, spans[rows, 2 * col], spans[rows, 2 * col + 1])
        if bad_at >= 0:
            line = int(rows[bad_at])
            raise ModelError(path, f"non-numeric level in {row_text(line)!r}", line=line + 1)
        levels.append(values)
    mean, stdv = levels
    if (bad := np.flatnonzero(~(np.isfinite(mean) & np.isfinite(stdv) & (stdv > 0)))).size:
        line = int(rows[bad[0]])
        raise ModelError(path, f"level_stdv must be positive and finite in {row_text(line)!r}", line=line + 1)
    level_mean, level_stdv = mean.astype(np.float32), stdv.astype(np.float32)
    return PoreModel(path.name, k, alphabet, level_mean, level_stdv, logf(level_stdv))


def builtin_model_path(name: str) -> Path:
    """Path of a model shipped as package data."""
    return Path(str(resources.files("streamer") / "data" / "models" / name))


def load_kmer_model(kmer_model: str | Path | None = None) -> PoreModel:
    """The nucleotide model, from the given file (text or `.npz`, any k) or the shipped r9.4 6-mer one."""
    kmer = load_model(kmer_model or builtin_model_path(DEFAULT_KMER_MODEL))
    if kmer.alphabet != NUCLEOTIDE:
        raise ModelError(kmer.name, f"k-mer model must use alphabet {NUCLEOTIDE}, not {kmer.alphabet}")
    return kmer


def load_default_models(kmer_model: str | Path | None = None, meth_model: str | Path | None = None):
    """The nucleotide and CpG models, from the given files or the shipped r9.4 ones."""
    kmer = load_kmer_model(kmer_model)
    meth = load_model(meth_model or builtin_model_path(DEFAULT_METH_MODEL))
    if meth.alphabet != METHYL_CPG:
        raise ModelError(meth.name, f"methylation model must use alphabet {METHYL_CPG}, not {meth.alphabet}")
    if kmer.k != meth.k:
        raise ModelError(meth.name, f"k={meth.k} differs from the k-mer model's k={kmer.k}")
    return kmer, meth


def model_dir() -> Path:
    """Where per-pore model files are looked for: `$STREAMER_MODEL_DIR`, else
    `$XDG_DATA_HOME/streamer/models` (`~/.local/share/...`)."""
    if env := os.environ.get("STREAMER_MODEL_DIR"):
        return Path(env)
    return user_data_dir() / "models"


@numba.njit(nogil=True, cache=True)
def kmer_rank(seq, pos, k, codes, base):
    """Rank of the k-mer starting at seq[pos] (seq: uint8 ASCII); -1 if a letter is outside the alphabet."""
    r = 0
    for i in range(k):
        c = codes[seq[pos + i]]
        if c < 0:
            return -1
        r = r * base + c
    return r
