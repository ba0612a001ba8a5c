import numpy as np
import pytest

from streamer.errors import ModelError
from streamer.poremodel import (
    METHYL_CPG,
    NUC_CODE,
    NUCLEOTIDE,
    builtin_model_path,
    DEFAULT_KMER_MODEL,
    kmer_rank,
    load_default_models,
    load_model,
)


def test_shipped_models_load_and_agree():
    kmer, meth = load_default_models()
    assert (kmer.k, kmer.alphabet, kmer.n_kmers) == (6, NUCLEOTIDE, 4096)
    assert (meth.k, meth.alphabet, meth.n_kmers) == (6, METHYL_CPG, 15625)
    # AAAAAA is rank 0 in both; the file's first row
    assert kmer.level_mean[0] == pytest.approx(86.48634, abs=1e-6)  # 5 decimals, as nanopolish and f5c build it in
    assert np.allclose(kmer.level_log_stdv, np.log(kmer.level_stdv), atol=1e-6)
    assert kmer.level_log_stdv.dtype == np.float32


def test_kmer_rank_is_base4_most_significant_first():
    seq = np.frombuffer(b"AAAAACGTTTTTTN", dtype=np.uint8)
    assert kmer_rank(seq, 0, 6, NUC_CODE, 4) == 1
    assert kmer_rank(seq, 2, 6, NUC_CODE, 4) == int("AAACGT".translate(str.maketrans("ACGT", "0123")), 4)
    assert kmer_rank(seq, 7, 6, NUC_CODE, 4) == 4**6 - 1
    assert kmer_rank(seq, 8, 6, NUC_CODE, 4) == -1  # N is outside the alphabet


def _write_model(tmp_path, rows, header="#k\t2\n"):
    p = tmp_path / "bad.model"
    p.write_text(header + "".join(rows))
    return p


def _rows(k=2, alphabet="ACGT"):
    import itertools

    return [f"{''.join(t)}\t80.0\t1.5\t1.0\t0.5\n" for t in itertools.product(alphabet, repeat=k)]


def test_small_valid_model(tmp_path):
    m = load_model(_write_model(tmp_path, _rows()))
    assert m.k == 2 and m.n_kmers == 16


@pytest.mark.parametrize(
    "mutate, message, line",
    [
        (lambda r: r[:-1], "15 rows, expected 4^2 = 16", None),
        (lambda r: [r[1], r[0]] + r[2:], "out of rank order", 2),
        (lambda r: r[:3] + ["AT\tabc\t1.0\n"] + r[4:], "non-numeric", 5),
        (lambda r: r[:3] + ["AT\t80.0\n"] + r[4:], "expected 'kmer level_mean level_stdv'", 5),
        (lambda r: r[:3] + ["AT\t80.0\t-1.0\n"] + r[4:], "positive", 5),
    ],
)
def test_malformed_models_name_file_and_line(tmp_path, mutate, message, line):
    p = _write_model(tmp_path, mutate(_rows()))
    with pytest.raises(ModelError) as err:
        load_model(p)
    assert message in str(err.value)
    assert str(p) in str(err.value)
    if line is not None:
        assert f"{p}:{line}" in str(err.value)


def test_header_k_must_match(tmp_path):
    with pytest.raises(ModelError, match="header says k=3"):
        load_model(_write_model(tmp_path, _rows(), header="#k\t3\n"))


def test_missing_model_file(tmp_path):
    with pytest.raises(ModelError, match="cannot read model file"):
        load_model(tmp_path / "nope.model")


def test_models_must_fit_their_role(tmp_path):
    with pytest.raises(ModelError, match="k-mer model must use alphabet ACGT"):
        load_default_models(kmer_model=builtin_model_path("r9.4_450bps.cpg.6mer.template.model"))
    with pytest.raises(ModelError, match="methylation model must use alphabet ACGMT"):
        load_default_models(meth_model=builtin_model_path(DEFAULT_KMER_MODEL))
