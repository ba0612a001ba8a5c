"""Pore models: expected current level per k-mer, loaded and checked once.

A model file has `#key value` header lines, then one row per k-mer in rank order:
`kmer level_mean level_stdv [sd_mean sd_stdv ...]`. Nucleotide models use the
alphabet ACGT (4^k rows); methylation models ACGMT, where M is a methylated C
(5^k rows). Ranks are base-|alphabet| numbers with the first base most significant.
uncalled4's `.npz` level tables (ONT's R10.4.1 400bps 9-mer, MIT; 5.6 MB, so not shipped:
pass its path) load into the same `PoreModel`.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numba
import numpy as np

from streamer.errors import ModelError

NUCLEOTIDE = "ACGT"
METHYL_CPG = "ACGMT"

DEFAULT_KMER_MODEL = "r9.4_450bps.nucleotide.6mer.template.model"
DEFAULT_METH_MODEL = "r9.4_450bps.cpg.6mer.template.model"
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
    ModelError naming file and line."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"PK":  # .npz is a zip archive
                return load_npz_model(path)
        text = path.read_text()
    except OSError as exc:
        raise ModelError(path, f"cannot read model file: {exc.strerror}") from exc
    k_header = None
    kmers, means, stdvs, lines = [], [], [], []
    for line_no, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if line.startswith("#"):
            if fields[0] == "#k" and len(fields) > 1:
                try:
                    k_header = int(fields[1])
                except ValueError:
                    raise ModelError(path, f"invalid k-mer size {fields[1]!r}", line=line_no) from None
            continue
        if fields[0] == "kmer":
            continue
        if len(fields) < 3:
            raise ModelError(path, "expected 'kmer level_mean level_stdv'", line=line_no)
        try:
            mean, stdv = float(fields[1]), float(fields[2])
        except ValueError:
            raise ModelError(path, f"non-numeric level in {line.strip()!r}", line=line_no) from None
        if not (np.isfinite(mean) and np.isfinite(stdv) and stdv > 0):
            raise ModelError(path, f"level_stdv must be positive and finite in {line.strip()!r}", line=line_no)
        kmers.append(fields[0].upper())
        means.append(mean)
        stdvs.append(stdv)
        lines.append(line_no)
    if not kmers:
        raise ModelError(path, "no k-mer rows")
    k = len(kmers[0])
    if k_header is not None and k_header != k:
        raise ModelError(path, f"header says k={k_header} but k-mers have length {k}", line=lines[0])
    alphabet = METHYL_CPG if any("M" in km for km in kmers) else NUCLEOTIDE
    expected = len(alphabet) ** k
    if len(kmers) != expected:
        raise ModelError(path, f"{len(kmers)} rows, expected {len(alphabet)}^{k} = {expected} for alphabet {alphabet}")
    for rank, (km, line_no) in enumerate(zip(kmers, lines)):
        if len(km) != k or km != _kmer_at_rank(rank, k, alphabet):
            raise ModelError(
                path, f"k-mer {km!r} out of rank order (expected {_kmer_at_rank(rank, k, alphabet)!r})", line=line_no
            )
    level_mean = np.asarray(means, dtype=np.float32)
    level_stdv = np.asarray(stdvs, dtype=np.float32)
    return PoreModel(
        name=path.name,
        k=k,
        alphabet=alphabet,
        level_mean=level_mean,
        level_stdv=level_stdv,
        level_log_stdv=logf(level_stdv),
    )


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
