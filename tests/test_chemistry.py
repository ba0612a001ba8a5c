"""The pore chemistry registry: one description per chemistry, read by the configuration, the commands'
flags and the pipeline."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from streamer import config
from streamer.commands._inputs import add_input_arguments
from streamer.errors import StreamerError
from streamer.pipeline.events import RNA_PARAMS
from streamer.pipeline.stages import PipelineOptions
from streamer.pipeline.chemistry import CHEMISTRIES, DEFAULT, PORES, R9, R10, chemistry, pore_from_metadata, pore_models
from streamer.pore.model import builtin_model_path, load_model


def test_every_chemistry_is_a_choice_of_the_configuration_and_the_flags():
    key = next(k for k in config.schema() if k.path == "pipeline.pore")
    assert key.choices == ("auto", *PORES) == ("auto", "r9", "r10")
    parser = argparse.ArgumentParser()
    add_input_arguments(parser, "calls")
    pore = next(a for a in parser._actions if a.dest == "pore")
    assert tuple(pore.choices) == ("auto", *PORES)


def test_shipped_models_are_there_with_the_chemistry_k():
    for c in CHEMISTRIES.values():
        for model in (c.kmer_model, c.meth_model):
            if model.shipped:
                assert load_model(builtin_model_path(model.name)).k == c.k


def test_run_metadata_names_one_chemistry_and_none_is_the_default():
    assert pore_from_metadata(["FLO-PRO114M", "SQK-LSK114"]) == R10.name
    assert pore_from_metadata(["FLO-MIN106", "SQK-LSK109"]) == R9.name
    assert pore_from_metadata(["SQK-RNA002"]) is None
    assert chemistry(None) is DEFAULT and PipelineOptions().chemistry is DEFAULT


def test_an_rna_description_is_expressible_and_refused_with_one_line(tmp_path):
    rna = dataclasses.replace(R9, name="rna002", title="RNA002", events=RNA_PARAMS, reverse_signal=True,
                              u_to_t=True, recognise=r"SQK-RNA002")  # fmt: skip
    assert rna.names_run("FLO-MIN106 SQK-RNA002") and not R9.names_run("SQK-RNA002")
    with pytest.raises(StreamerError) as info:
        rna.models(None, None, tmp_path)
    assert str(info.value) == "RNA002: RNA reads (3'->5' signal, U models) are not supported yet"


def test_a_model_given_is_kept_whatever_the_chemistry(tmp_path):
    given = tmp_path / "mine.model"
    assert pore_models("r10", kmer_model=given, meth_model=given, folder=tmp_path) == (given, given)
    assert pore_models("r9", kmer_model=given) == (given, None)
