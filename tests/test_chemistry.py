"""The pore chemistry registry: one description per chemistry, read by the configuration, the commands'
flags and the pipeline."""

from __future__ import annotations

import argparse
import pytest

from streamer import config
from streamer.commands._inputs import add_input_arguments
from streamer.errors import ModelError, UsageError
from streamer.pipeline.events import RNA_PARAMS
from streamer.pipeline.stages import PipelineOptions
from streamer.pipeline.chemistry import (CHEMISTRIES, DEFAULT, PORES, R9, R10, RNA002, RNA004, as_rna, chemistry,
                                         pore_from_metadata, pore_models)
from streamer.pore.model import builtin_model_path, load_model


def test_every_chemistry_is_a_choice_of_the_configuration_and_the_flags():
    key = next(k for k in config.schema() if k.path == "pipeline.pore")
    assert key.choices == ("auto", *PORES) == ("auto", "r9", "r10", "rna002", "rna004")
    parser = argparse.ArgumentParser()
    add_input_arguments(parser, "calls")
    pore = next(a for a in parser._actions if a.dest == "pore")
    assert tuple(pore.choices) == ("auto", *PORES)


def test_shipped_models_are_there_with_the_chemistry_k():
    for c in CHEMISTRIES.values():
        for model in (c.kmer_model, c.meth_model):
            if model is not None and model.shipped:
                assert load_model(builtin_model_path(model.name)).k == c.k


def test_run_metadata_names_one_chemistry_and_none_is_the_default():
    assert pore_from_metadata(["FLO-PRO114M", "SQK-LSK114"]) == R10.name
    assert pore_from_metadata(["FLO-MIN106", "SQK-LSK109"]) == R9.name
    assert pore_from_metadata(["FLO-MIN106", "sqk-rna002"]) == RNA002.name  # MinKNOW writes kits in lower case
    assert pore_from_metadata(["FLO-PRO004RA", "SQK-RNA004"]) == pore_from_metadata(["FLO-MIN004RA"]) == RNA004.name
    # f5c: an experiment_type of rna is direct RNA, RNA004 where the kit says so, else RNA002
    assert pore_from_metadata(["rna"]) == RNA002.name and pore_from_metadata(["rna", "sqk-rna004"]) == RNA004.name
    assert pore_from_metadata(["genomic_dna", "FLO-MIN106"]) == R9.name
    assert pore_from_metadata(["SQK-LSK114", "FLO-PRO114M"]) == R10.name
    assert chemistry(None) is DEFAULT and PipelineOptions().chemistry is DEFAULT


def test_rna_chemistries_are_f5c_16s(tmp_path):
    """RNA's event windows, U read as T, the signal turned round; the shipped RNA002 table; no methylation."""
    for rna, k, rate in ((RNA002, 5, 3000.0), (RNA004, 9, 4000.0)):
        assert (rna.k, rna.sample_rate, rna.events, rna.reverse_signal, rna.u_to_t) == (k, rate, RNA_PARAMS, True, True)
        with pytest.raises(ModelError, match="methylation calling is not supported for RNA reads"):
            rna.models(None, None, tmp_path)
    assert pore_models("rna002", methylation=False) == (builtin_model_path(RNA002.kmer_model.name), None)
    with pytest.raises(ModelError, match="no RNA004 9-mer nucleotide model: f5c 1.4 and later"):
        pore_models("rna004", folder=tmp_path, methylation=False)


def test_rna_flag_makes_the_pore_direct_rna():
    assert as_rna(None) == as_rna("r9") == as_rna("rna002") == "rna002" and as_rna("rna004") == "rna004"
    with pytest.raises(UsageError, match="R10.4.1 has no direct RNA kit"):
        as_rna("r10")


def test_the_rna_flag_help_names_the_direct_rna_chemistries_of_the_registry(monkeypatch):
    from dataclasses import replace

    from streamer.commands import eventalign

    def rna_help() -> str:
        parser = argparse.ArgumentParser()
        eventalign.add_arguments(parser)
        return next(a for a in parser._actions if a.dest == "rna").help

    assert rna_help().startswith("direct RNA reads (f5c's --rna): RNA002, or RNA004 where --pore or the run metadata")
    monkeypatch.setitem(CHEMISTRIES, "rna005", replace(RNA004, name="rna005", title="RNA005"))  # a new entry
    assert "RNA002, or RNA004 or RNA005 where" in rna_help()


def test_a_model_given_is_kept_whatever_the_chemistry(tmp_path):
    given = tmp_path / "mine.model"
    assert pore_models("r10", kmer_model=given, meth_model=given, folder=tmp_path) == (given, given)
    assert pore_models("r9", kmer_model=given) == (given, None)
