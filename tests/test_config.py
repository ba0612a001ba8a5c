"""Configuration: the shipped file matches the schema; validation names every bad key."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from streamer import config
from streamer.cli import EXIT_CONFIG, main
from streamer.errors import ConfigError
from streamer_plugins.outputs.methfreq import CALL_THRESHOLD

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).parent / "data" / "config"


def test_shipped_file_is_the_rendered_schema():
    """config/streamer.yaml is exactly what the schema renders: keys, defaults and comments."""
    assert (ROOT / "config" / "streamer.yaml").read_text() == config.render_defaults()


def test_shipped_file_loads_to_the_defaults(tmp_path):
    data = yaml.safe_load((ROOT / "config" / "streamer.yaml").read_text())
    defaults = config.Config().as_dict()
    assert data == defaults
    loaded = config.load(ROOT / "config" / "streamer.yaml", require=())
    assert loaded == config.Config()


def test_every_key_documented_with_a_unique_flag():
    keys = config.schema()
    flags = [k.flag for k in keys] + [k.short for k in keys if k.short]
    assert len(flags) == len(set(flags))
    assert all(k.help.strip() for k in keys)


def test_methfreq_threshold_default_matches_the_plugin():
    assert config.Config().output.call_threshold == CALL_THRESHOLD


def _run_flags(tmp_path, reference_path) -> list[str]:
    """What the template unit passes `streamer run` besides --config, plus the reference."""
    return ["--watch", str(tmp_path), "--output", str(tmp_path / "out"), "-g", str(reference_path)]


@pytest.mark.parametrize("case", sorted((CASES / "pass").glob("*.yaml")), ids=lambda p: p.stem)
def test_validate_config_passes(case, capsys, tmp_path, reference_path):
    assert main(["validate-config", str(case), *_run_flags(tmp_path, reference_path)]) == 0
    assert capsys.readouterr().out == f"{case}: ok\n"


@pytest.mark.parametrize("case", sorted((CASES / "fail").glob("*.yaml")), ids=lambda p: p.stem)
def test_validate_config_fails_with_the_key_path(case, capsys):
    assert main(["validate-config", str(case)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("streamer validate-config: configuration error: ")
    for line in case.with_suffix(".err").read_text().splitlines():
        assert line in err


def test_all_problems_reported_at_once(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("watch:\n  pol: true\nbatch:\n  max_reads: 0\n")
    with pytest.raises(ConfigError) as exc:
        config.load(f, require=())
    assert str(exc.value).startswith("2 problems in ")


def test_required_keys_for_run():
    with pytest.raises(ConfigError) as exc:
        config.load(None, {})
    for key in config.REQUIRED_FOR_RUN:
        assert f"{key}: required" in str(exc.value)
    assert main(["validate-config", str(CASES / "pass" / "001-empty.yaml")]) == EXIT_CONFIG


def test_the_shipped_file_passes_once_its_required_keys_are_filled(tmp_path, reference_path, capsys):
    """As the README sets the service up: copy config/streamer.yaml, set the reference, check it with the
    flags the template unit passes (--watch, --output)."""
    shipped = (ROOT / "config" / "streamer.yaml").read_text()
    unit = ["--watch", str(tmp_path), "--output", str(tmp_path / "out")]
    as_shipped = tmp_path / "shipped.yaml"
    as_shipped.write_text(shipped)
    assert main(["validate-config", str(as_shipped), *unit]) == EXIT_CONFIG
    assert "reference.genome: required" in capsys.readouterr().err
    filled = tmp_path / "streamer.yaml"
    filled.write_text(shipped.replace("  genome: null", f"  genome: {reference_path}"))
    assert main(["validate-config", str(filled), *unit]) == 0


def test_flags_override_the_file(tmp_path, reference_path):
    run = tmp_path / "run"
    run.mkdir()
    f = tmp_path / "c.yaml"
    f.write_text(f"watch:\n  dir: {run}\n  poll: true\nbatch:\n  max_reads: 7\n")
    parser = argparse.ArgumentParser()
    config.add_flags(parser)
    args = parser.parse_args(["--no-poll", "-K", "9", "-g", str(reference_path), "-o", str(tmp_path / "out")])
    cfg = config.load(f, config.overrides_from(args))
    assert cfg.watch.dir == run and cfg.watch.poll is False and cfg.batch.max_reads == 9
    assert cfg.batch.max_bases == config.BatchConfig().max_bases
    assert cfg.state_dir() == tmp_path / "out" / ".streamer"


def test_flag_values_are_validated_too(tmp_path, reference_path):
    parser = argparse.ArgumentParser()
    config.add_flags(parser)
    args = parser.parse_args(["--watch", str(tmp_path / "nope"), "-g", str(reference_path), "-o", str(tmp_path),
                              "--settle", "-2"])
    with pytest.raises(ConfigError, match="watch.dir: .*no such folder") as exc:
        config.load(None, config.overrides_from(args))
    assert "watch.settle: must be at least 0" in str(exc.value)


def test_defaults_printed(capsys):
    assert main(["validate-config", "--defaults"]) == 0
    assert capsys.readouterr().out == config.render_defaults()


def test_gpu_defaults_match_the_gpu_stage():
    from streamer.pipeline.gpu import CudaOptions

    g, c = config.Config().gpu, CudaOptions()
    assert (g.disable, g.device, g.mem_frac, g.avg_epk, g.max_lf, g.max_epk, g.ultra_thresh) == \
        (c.disable, str(c.dev_id), c.mem_frac, c.avg_epk, c.max_lf, c.max_epk, c.ultra_thresh)


def test_list_keys_from_the_file_and_repeated_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("publish:\n  extra_endpoints: [ipc:///tmp/a.sock, 'tcp://127.0.0.1:6000']\n")
    assert config.load(f, require=()).publish.extra_endpoints == ("ipc:///tmp/a.sock", "tcp://127.0.0.1:6000")
    f.write_text("publish:\n  extra_endpoints:\n")
    assert config.load(f, require=()).publish.extra_endpoints == ()
    parser = argparse.ArgumentParser()
    config.add_flags(parser)
    args = parser.parse_args(["--publish-also", "ipc:///tmp/b.sock", "--publish-also", "ipc:///tmp/c.sock"])
    got = config.load(f, config.overrides_from(args), require=())
    assert got.publish.extra_endpoints == ("ipc:///tmp/b.sock", "ipc:///tmp/c.sock")
    f.write_text("publish:\n  extra_endpoints: [5556]\n")
    with pytest.raises(ConfigError, match=r"publish.extra_endpoints: expected a list of strings, got \[5556\]"):
        config.load(f, require=())


def test_disable_hmm_reaches_the_pipelines_cuda_options(tmp_path):
    from streamer.commands.run import cuda_options

    assert cuda_options(config.Config()).hmm is True
    f = tmp_path / "c.yaml"
    f.write_text("gpu:\n  disable_hmm: true\n")
    assert cuda_options(config.load(f, require=())).hmm is False
    parser = argparse.ArgumentParser()
    config.add_flags(parser)
    args = parser.parse_args(["--disable-cuda-hmm", "--cuda-dev-id", "1"])
    options = cuda_options(config.load(None, config.overrides_from(args), require=()))
    assert options.hmm is False and options.disable is False and options.dev_id == 1
