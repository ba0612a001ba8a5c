"""The profile HMM's model: its parameters, per-read transitions and clip flanks, and the packed
level table and scalings the forward pass (`streamer_plugins.cpg.hmm`) and eventalign's Viterbi read.

float32 probabilities with logf and flanks in double stored as float32, as f5c computes them. The
level table and scalings come in two precisions: f5c's, float32 (`pack_model`, `pack_scalings`), and
nanopolish 0.14's, double (`pack_model64`, `pack_scalings64`): its built-in tables to 5 decimals, and
the reads recalibrated again against them (`nanopolish_scaling`), as nanopolish's own stages would.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

import numba
import numpy as np

from streamer.pipeline.batch import ReadBatch
from streamer.pipeline.postalign import PostalignParams, PostalignReads, recalibrate_batch
from streamer.pore.model import PoreModel

# Offsets of the three states inside a block.
STATE_K, STATE_B, STATE_M = 0, 1, 2
N_STATES = 3

# Indices into the transition vector from `block_transitions`.
T_MM_SELF, T_MB, T_MK, T_MM_NEXT, T_BB, T_BK, T_BM_NEXT, T_BM_SELF, T_KK, T_KM = range(10)

# Indices into the parameter vector (`HmmParams.as_array`).
P_SKIP, P_SKIP_SELF, P_BAD, P_BAD_SELF, P_START_TO_CLIP, P_CLIP_SELF, P_BACKGROUND = range(7)

# Indices into the per-read scalings rows (`pack_scalings`).
S_SCALE, S_SHIFT, S_VAR, S_LOG_VAR = range(4)

# values kept per k-mer block of the forward pass: the row's M, B, K and the level mean, stdv, log stdv
SLOTS = 6


@dataclass(frozen=True)
class HmmParams:
    """Transition and clipping probabilities of the methylation HMM (nanopolish's defaults)."""

    p_skip: float = 0.0025
    p_skip_self: float = 0.3
    p_bad: float = 0.001
    p_bad_self: float = 0.001
    start_to_clip: float = 0.5
    clip_self: float = 0.9
    background: float = -3.0  # log-probability of an event emitted by the clip state

    def as_array(self) -> np.ndarray:
        return np.array(astuple(self), dtype=np.float64)


@numba.njit(nogil=True, cache=True)
def logf(x):
    """Single-precision log of a float32, libm's logf.

    f5c is built as C++, where `log(float)` is `logf`; it can differ in the last bit from
    the correctly rounded `float(log(double(x)))` and from numpy's vectorised float32 log.
    """
    return math.log(np.float32(x))


@numba.njit(nogil=True, cache=True)
def _logf_array(x):
    out = np.empty(x.shape[0], np.float32)
    for i in range(x.shape[0]):
        out[i] = logf(x[i])
    return out


def pack_model(level_mean: np.ndarray, level_stdv: np.ndarray) -> np.ndarray:
    """float32[3, n_kmers]: level mean, stdv and log stdv (logf, as f5c caches it)."""
    stdv = np.ascontiguousarray(level_stdv, dtype=np.float32)
    return np.stack([np.asarray(level_mean, dtype=np.float32), stdv, _logf_array(stdv)])


def nanopolish_model(model: PoreModel) -> PoreModel:
    """A model as nanopolish's built-in tables hold it: values to 5 decimals, in double."""
    mean = np.round(model.level_mean.astype(np.float64), 5)
    stdv = np.round(model.level_stdv.astype(np.float64), 5)
    return PoreModel(model.name, model.k, model.alphabet, mean, stdv, np.log(stdv))


@dataclass(frozen=True)
class NanopolishScaling:
    """nanopolish 0.14's nucleotide model and per-read scalings, all double (`nanopolish_scaling`)."""

    level_mean: np.ndarray  # float64[n_kmers]
    level_stdv: np.ndarray  # float64[n_kmers]
    shift: np.ndarray  # float64[n_reads]
    scale: np.ndarray  # float64[n_reads]
    var: np.ndarray  # float64[n_reads]
    status: np.ndarray  # int8[n_reads]: the reads' `Skip` codes after this recalibration and its QC


def nanopolish_scaling(batch: ReadBatch, kmer_model: PoreModel,
                       params: PostalignParams = PostalignParams()) -> NanopolishScaling:  # fmt: skip
    """The reads' scalings as nanopolish 0.14 has them: recalibrated again, from the method-of-moments
    scalings, against its double nucleotide model (the stages before are f5c's, which are nanopolish's)."""
    model = nanopolish_model(kmer_model)
    shift, scale, var = batch.mom_scalings
    reads = PostalignReads(batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.aln_kmer, batch.aln_event,
                           batch.aln_off, batch.status.copy(), shift, scale, var)  # fmt: skip
    exact = recalibrate_batch(reads, model, params).exact
    return NanopolishScaling(model.level_mean, model.level_stdv, exact[:, 0], exact[:, 1], exact[:, 2], reads.status)


def pack_model64(model: PoreModel) -> np.ndarray:
    """float64[3, n_kmers]: nanopolish's level mean, stdv and log stdv (`nanopolish_model`)."""
    double = nanopolish_model(model)
    return np.stack([double.level_mean, double.level_stdv, double.level_log_stdv])


def pack_scalings64(scaling: NanopolishScaling) -> np.ndarray:
    """float64[n, 4]: nanopolish's scale, shift, var and log var per read (NaN where not recalibrated)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.stack([scaling.scale, scaling.shift, scaling.var, np.log(scaling.var)], axis=1)


def pack_scalings(
    scale: np.ndarray, shift: np.ndarray, var: np.ndarray, log_var: np.ndarray | None = None
) -> np.ndarray:
    """float32[n, 4]: scale, shift, var and log var per read.

    f5c caches log var from the double-precision var of recalibration; pass `log_var` when
    that is known, otherwise it is taken (in double) from the float32 var.
    """
    var32 = np.asarray(var, dtype=np.float32)
    if log_var is None:
        with np.errstate(divide="ignore", invalid="ignore"):
            log_var = np.log(var32.astype(np.float64))
    return np.stack(
        [
            np.asarray(scale, dtype=np.float32),
            np.asarray(shift, dtype=np.float32),
            var32,
            np.asarray(log_var).astype(np.float32),
        ],
        axis=1,
    )


@numba.njit(nogil=True, cache=True)
def block_transitions(events_per_base, params):
    """float32[10] log transition probabilities, the same for every block of a read.

    The probability of staying on a k-mer follows the read's speed: 1 - 1 / events per base
    (in double, stored as float32); the logs are of float32 probabilities, hence logf.
    """
    one = np.float32(1.0)
    p_stay = np.float32(1.0 - 1.0 / events_per_base)
    p_skip = np.float32(params[P_SKIP])
    p_bad = np.float32(params[P_BAD])
    p_bad_self = np.float32(params[P_BAD_SELF])
    p_skip_self = np.float32(params[P_SKIP_SELF])
    p_mm_next = one - p_stay - p_skip - p_bad
    p_b_leave = (one - p_bad_self) / np.float32(3.0)
    t = np.empty(10, np.float32)
    t[T_MM_SELF] = logf(p_stay)
    t[T_MB] = logf(p_bad)
    t[T_MK] = logf(p_skip)
    t[T_MM_NEXT] = logf(p_mm_next)
    t[T_BB] = logf(p_bad_self)
    t[T_BK] = logf(p_b_leave)
    t[T_BM_NEXT] = logf(p_b_leave)
    t[T_BM_SELF] = logf(p_b_leave)
    t[T_KK] = logf(p_skip_self)
    t[T_KM] = logf(one - p_skip_self)
    return t


@numba.njit(nogil=True, cache=True)
def clip_flanks(n_events, params, pre, post):
    """Fill pre[i] (the first i events clipped) and post[i] (events after i clipped), float32[n_events]."""
    to_clip = params[P_START_TO_CLIP]
    clip_self = params[P_CLIP_SELF]
    background = np.float64(np.float32(params[P_BACKGROUND]))
    pre[0] = np.float32(math.log(1.0 - to_clip))
    post[n_events - 1] = np.float32(math.log(1.0 - to_clip))
    if n_events > 1:
        pre[1] = np.float32(math.log(to_clip) + background + math.log(1.0 - clip_self))
        post[n_events - 2] = np.float32(math.log(to_clip) + background + math.log(1.0 - clip_self))
    for i in range(2, n_events):
        pre[i] = np.float32(math.log(clip_self) + background + np.float64(pre[i - 1]))
    for i in range(n_events - 3, -1, -1):
        post[i] = np.float32(math.log(clip_self) + background + np.float64(post[i + 1]))


@numba.njit(nogil=True, cache=True)
def read_transitions(job_read, events_per_base, params):
    """float32[n_reads, 10]: `block_transitions` of every read that has a job (zeros elsewhere)."""
    out = np.zeros((events_per_base.shape[0], 10), np.float32)
    done = np.zeros(events_per_base.shape[0], np.bool_)
    for j in range(job_read.shape[0]):
        r = job_read[j]
        if not done[r]:
            out[r] = block_transitions(events_per_base[r], params)
            done[r] = True
    return out


@numba.njit(nogil=True, cache=True)
def flank_table(n_events, params):
    """float32[n_events]: flank[i] is `clip_flanks`' pre[i] for any window of more than i events.

    pre[i] (the first i events clipped) depends on i only, and post[i] of a window of n events
    equals pre[n - 1 - i] (the same recurrence from the other end), so one table serves both.
    """
    pre = np.empty(max(n_events, 1), np.float32)
    post = np.empty(max(n_events, 1), np.float32)
    clip_flanks(max(n_events, 1), params, pre, post)
    return pre
