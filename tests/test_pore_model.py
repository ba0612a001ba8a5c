import numpy as np
import pytest

from streamer.errors import ModelError
from streamer.pore.model import (
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


# --- CpG models of any k up to 9, the binary cache, per-pore defaults ------------------------------


def test_cpg_model_any_k(tmp_path):
    """A CpG model of k = 2 (25 rows over ACGMT) with nanopolish's headers; no `#k` line is needed."""
    p = _write_model(tmp_path, _rows(2, METHYL_CPG), header="#model_name\tx\n#alphabet\tcpg\n"
                     "kmer\tlevel_mean\tlevel_stdv\tsd_mean\tsd_stdv\tweight\n")  # fmt: skip
    m = load_model(p)
    assert (m.k, m.alphabet, m.n_kmers) == (2, METHYL_CPG, 25)


@pytest.mark.parametrize(
    "header, rows, message, line",
    [
        ("#alphabet\tprotein\n", _rows(2, METHYL_CPG), "alphabet 'protein' is not one streamer reads", 1),
        ("#alphabet\tcpg\n", _rows(2), "16 rows, expected 5^2 = 25 for alphabet ACGMT", None),
        ("#k\t2\n", _rows(2, METHYL_CPG)[:7] + ["AMA\t80.0\t1.5\n"] + _rows(2, METHYL_CPG)[8:],
         "has length 3, not 2", 9),
        ("", [r.replace("\t80.0", "\t" + "8" * 40) for r in _rows(2)], "non-numeric level", 1),
        ("#k\tnine\n", _rows(2), "invalid k-mer size 'nine'", 1),
    ],
)
def test_malformed_cpg_models(tmp_path, header, rows, message, line):
    p = _write_model(tmp_path, rows, header=header)
    with pytest.raises(ModelError) as err:
        load_model(p)
    assert message in str(err.value) and str(p) in str(err.value)
    if line is not None:
        assert f"{p}:{line}:" in str(err.value)


def test_k_beyond_9_is_refused(tmp_path):
    p = tmp_path / "k10.model"
    p.write_text("#k\t10\nAAAAAAAAAA\t80.0\t1.5\n")
    with pytest.raises(ModelError, match="header says k=10|beyond the largest supported k-mer size 9"):
        load_model(p)
    p.write_text("AAAAAAAAAA\t80.0\t1.5\n")
    with pytest.raises(ModelError, match="k=10 is beyond the largest supported k-mer size 9"):
        load_model(p)


def test_synthetic_cpg_model_round_trips_as_text(tmp_path):
    """The simulator's CpG model, written as text, loads back to the same float32 levels; its
    C-only rows are the nucleotide model's and each M shifts the level by the known amount."""
    from r10_sim import m_shift_profile, synthetic_cpg_model, write_text_model

    kmer = load_default_models()[0]
    meth = synthetic_cpg_model(kmer)
    write_text_model(meth, tmp_path / "cpg.model")
    back = load_model(tmp_path / "cpg.model")
    assert (back.k, back.alphabet, back.n_kmers) == (6, METHYL_CPG, 5**6)
    assert np.array_equal(back.level_mean, meth.level_mean) and np.array_equal(back.level_stdv, meth.level_stdv)
    rank5 = lambda s: int(s.translate(str.maketrans("ACGMT", "01234")), 5)  # noqa: E731
    rank4 = lambda s: int(s.translate(str.maketrans("ACGT", "0123")), 4)  # noqa: E731
    assert back.level_mean[rank5("ACGTTA")] == kmer.level_mean[rank4("ACGTTA")]
    shift = m_shift_profile(6)
    assert back.level_mean[rank5("AMGMGA")] == pytest.approx(kmer.level_mean[rank4("ACGCGA")] + shift[1] + shift[3],
                                                             abs=1e-4)  # fmt: skip


@pytest.fixture
def model_cache(tmp_path, monkeypatch):
    import streamer.pore.modeltext as modeltext

    monkeypatch.setattr(modeltext, "CACHE_MIN_BYTES", 0)
    monkeypatch.setenv("STREAMER_MODEL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_text_model_cached_by_content(tmp_path, model_cache, caplog):
    """The first load parses and caches (one line says so); later loads read the cache; an edit to
    the file is a new key; a damaged cache file is rebuilt."""
    p = _write_model(tmp_path, _rows(3, METHYL_CPG), header="#k\t3\n#alphabet\tcpg\n")
    with caplog.at_level("INFO", logger="streamer.pore.modeltext"):
        first = load_model(p)
    assert [r.message for r in caplog.records] == [f"{p}: parsed once and cached as {next(model_cache.iterdir())}"]
    caplog.clear()
    with caplog.at_level("INFO", logger="streamer.pore.modeltext"):
        again = load_model(p)
    assert not caplog.records
    for a in ("level_mean", "level_stdv", "level_log_stdv"):
        assert np.array_equal(getattr(again, a), getattr(first, a))
    assert (again.k, again.alphabet, again.name) == (3, METHYL_CPG, p.name)
    p.write_text(p.read_text().replace("\t80.0\t1.5", "\t81.0\t1.5", 1))
    edited = load_model(p)
    assert edited.level_mean[0] == 81.0 and len(list(model_cache.iterdir())) == 2
    for f in model_cache.iterdir():
        f.write_bytes(b"not a cache")
    with caplog.at_level("WARNING", logger="streamer.pore.modeltext"):
        assert load_model(p).level_mean[0] == 81.0
    assert "unreadable model cache, rebuilding it" in caplog.text


def test_unwritable_cache_still_loads(tmp_path, model_cache, caplog):
    model_cache.write_text("a file where the folder should be")
    p = _write_model(tmp_path, _rows(2))
    with caplog.at_level("WARNING", logger="streamer.pore.modeltext"):
        assert load_model(p).n_kmers == 16
    assert "cannot cache the parsed model" in caplog.text and "parsed on every start" in caplog.text


def test_r10_models_from_the_default_location(tmp_path, monkeypatch):
    from streamer.pipeline.chemistry import F5C_RELEASES, R10, pore_models

    R10_KMER_MODEL, R10_METH_MODEL = R10.kmer_model.name, R10.meth_model.name

    monkeypatch.setenv("STREAMER_MODEL_DIR", str(tmp_path))
    assert pore_models("r9") == (None, None)
    folder = tmp_path / "r10"
    folder.mkdir()
    (folder / R10_KMER_MODEL).write_bytes(b"")
    assert pore_models("r10", methylation=False) == (folder / R10_KMER_MODEL, None)
    with pytest.raises(ModelError) as err:
        pore_models("r10")
    message = str(err.value)
    assert message.startswith(f"{folder / R10_METH_MODEL}: no R10.4.1 CpG methylation model")
    assert F5C_RELEASES in message and "--meth-model" in message and "\n" not in message
    (folder / R10_METH_MODEL).write_bytes(b"")
    assert pore_models("r10") == (folder / R10_KMER_MODEL, folder / R10_METH_MODEL)
    given = tmp_path / "mine.model"
    assert pore_models("r10", meth_model=given) == (folder / R10_KMER_MODEL, given)
