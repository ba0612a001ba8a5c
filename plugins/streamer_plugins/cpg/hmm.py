"""nanopolish's profile HMM forward algorithm (R9), scoring a reference window against events.

Each k-mer of the window is a block of three states: M (an event matches the k-mer), B (a bad
event, emitted with log-probability 0) and K (the k-mer is skipped, silent). Events before and
after the window's own may be clipped to a background emission, so the window can start and end
at any event. The score is log P(events | window), once for the window as it is and once with the
modified base of each whole motif site in it written as M (`streamer.pore.motifs`: CpG, GpC, dam,
dcm; the motif is data the kernels take, `sites` and `marks`).

To agree with nanopolish and f5c to their printed precision the arithmetic is theirs: float32 cells
and emissions, transition probabilities in float32 with logf (f5c is C++), flank probabilities in
double stored as float32, HMMER's table log-sum, and the same order of summation. Where the two
differ the kernels take either's (`nanopolish`): f5c 1.1 scales each k-mer's level to the read in
float32 from a float32 model and scalings and takes -0.918938 for ln(1/sqrt(2 pi)); nanopolish 0.14
scales in double from double ones (`hmm_model.pack_model64`, `pack_scalings64`), rounds once, and
takes its own constant. That arithmetic is written once (`streamer_plugins.cpg.hmm_cells`) and
compiled here, for the CPU's lanes (`streamer_plugins.cpg.hmm_lanes`: `score_windows` runs a batch's
jobs sixteen windows at a time) and for CUDA (`streamer_plugins.cpg.hmm_cuda`), so all agree to the
bit; a job is one window of one read.

The kernels (`forward`, `profile_forward`, `score_windows`) take flat arrays and scalars, many of
them, as numba needs; the Python side passes the jobs and what they are scored against as two
records (`HmmJobs`, `HmmInputs`) to `score_jobs` or the GPU's `CudaHmm.score`.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from streamer.pipeline.targets import CPU
from streamer_plugins.cpg.hmm_cells import hmm_cells
from streamer_plugins.cpg.hmm_lanes import score_windows
from streamer_plugins.cpg.hmm_model import SLOTS, flank_table

_cpu = hmm_cells(CPU)
site_at, window_kmer_rank, scaled_level, scaled_level64, forward = (_cpu.site_at, _cpu.window_kmer_rank,
                                                                    _cpu.scaled_level, _cpu.scaled_level64,
                                                                    _cpu.forward)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def profile_forward(
    seq, w0, length, rc, methylated, sites, marks, ev_mean, e_start, e_stop, k, model, scalings, nanopolish, trans,
    params, table,
):  # fmt: skip
    """log P(events e_start..e_stop | window seq[w0:w0+length]) under the profile HMM, float32.

    Events are taken from `e_start` towards `e_stop` (either direction); `sites` and `marks` the
    motif's, `model` from `pack_model`, `scalings` one row of `pack_scalings` (or their double forms
    with `nanopolish`), `trans` from `block_transitions`.
    """
    n_kmers = length - k + 1
    cell = np.empty(SLOTS * max(n_kmers, 1), np.float32)
    flank = flank_table(abs(e_stop - e_start) + 1, params)
    return forward(seq, w0, length, rc, methylated, sites, marks, ev_mean, e_start, e_stop, k, model,
                   scalings.reshape((1, 4)), nanopolish, trans.reshape((1, 10)), 0, flank, table, cell)  # fmt: skip


class HmmJobs(NamedTuple):
    """The (read, window) jobs of a batch: window ref_seq[ref_seq_off[read] + w0 : ... + w1] against the
    read's events e1..e2 (indices within the read)."""

    read: np.ndarray
    w0: np.ndarray
    w1: np.ndarray
    e1: np.ndarray
    e2: np.ndarray


class HmmInputs(NamedTuple):
    """What every job of a batch is scored against: the reads' reference spans and events, their
    scalings and event rates, the model and its motif (`Motif.table`, `Motif.marks`), parameters and
    log-sum table, and whose arithmetic (`nanopolish`: scalings and model in double, as
    `pack_scalings64` and `pack_model64` give them; else float32, f5c's)."""

    ref_seq: np.ndarray
    ref_seq_off: np.ndarray
    rc: np.ndarray
    ev_mean: np.ndarray
    ev_off: np.ndarray
    scalings: np.ndarray
    events_per_base: np.ndarray
    k: int
    model: np.ndarray
    sites: np.ndarray
    marks: np.ndarray
    params: np.ndarray
    table: np.ndarray
    nanopolish: bool


def score_jobs(jobs: HmmJobs, inputs: HmmInputs) -> tuple[np.ndarray, np.ndarray]:
    """`score_windows` of the jobs: (ll_unmethylated, ll_methylated), float32. The GPU's `CudaHmm.score`
    takes the same two records."""
    return score_windows(*jobs, *inputs)
