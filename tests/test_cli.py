"""The command line: streamer's lines short at INFO, other libraries' (numba's bytecode dumps,
numba-cuda's frees) only with -vv, -q for warnings alone; a read-only install; --version; usage."""

from __future__ import annotations

import logging

import pytest

from streamer.cli import build_parser, configure_logging


@pytest.mark.parametrize(("flags", "own", "numba"), [
    ([], logging.INFO, logging.WARNING),
    (["-q"], logging.WARNING, logging.WARNING),
    (["-v"], logging.DEBUG, logging.WARNING),
    (["-vv"], logging.DEBUG, logging.DEBUG),
])
def test_levels_follow_the_flags(flags, own, numba):
    args = build_parser().parse_args([*flags, "meth-freq", "x.tsv"])
    configure_logging(args.verbose, args.quiet)
    assert logging.getLogger("streamer.daemon.shell").getEffectiveLevel() == own
    assert logging.getLogger("streamer_gpu.abea").getEffectiveLevel() == own
    assert logging.getLogger("numba.cuda.cudadrv.driver").getEffectiveLevel() == numba


def test_default_lines_are_short(capsys):
    configure_logging()
    logging.getLogger("streamer.x").info("calls written: 3")
    logging.getLogger("streamer.x").warning("a.fast5: read r1 has no signal")
    logging.getLogger("numba.cuda.cudadrv.driver").info("add pending dealloc: cuMemFree 256 bytes")
    assert capsys.readouterr().err.splitlines() == ["calls written: 3", "warning: a.fast5: read r1 has no signal"]


def test_quiet_and_verbose_exclude_each_other():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["-q", "-v", "meth-freq", "x.tsv"])


def test_kernels_are_cached_where_they_can_be(tmp_path):
    """A read-only install (here: a package folder that cannot be written) with no NUMBA_CACHE_DIR."""
    from streamer import numba_cache_dir

    read_only = tmp_path / "site-packages" / "streamer"  # absent: not writable
    assert numba_cache_dir(tmp_path, {}) is None  # numba's own choice works
    assert numba_cache_dir(read_only, {"NUMBA_CACHE_DIR": "/somewhere"}) is None  # the user's choice
    cache = numba_cache_dir(read_only, {"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert cache == tmp_path / "cache" / "streamer" / "numba" and cache.is_dir()
    assert numba_cache_dir(read_only, {"HOME": str(tmp_path / "home")}) == tmp_path / "home" / ".cache" / "streamer" / "numba"
    homeless = numba_cache_dir(read_only, {})  # a service user with no home: the temporary folder
    assert homeless is not None and homeless.name.startswith("streamer-numba-") and homeless.is_dir()


def test_parallel_regions_run_under_tbb_where_its_wheel_is_installed():
    """The `tbb` wheel's library is off the loader's path; streamer loads it, so numba picks TBB. A layer
    the user names (NUMBA_THREADING_LAYER) is theirs."""
    import importlib.metadata
    import os
    import subprocess
    import sys

    from streamer import load_tbb

    probe = ("import streamer, numba, numpy as np\n"
             "f = numba.njit(parallel=True)(lambda a: (a * 2).sum())\n"
             "f(np.ones(64)); print(numba.threading_layer())")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    try:
        importlib.metadata.distribution("tbb")
    except importlib.metadata.PackageNotFoundError:
        assert load_tbb(env) is None
    else:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
        assert out.stdout.split() == ["tbb"]
    assert load_tbb({**env, "NUMBA_THREADING_LAYER": "omp"}) is None


def test_numba_finds_no_blas_at_start_up_without_scipy_linalg(tmp_path):
    """numba's start-up check for BLAS no longer imports SciPy's linalg (0.3-0.4 s on a GPU box); an import
    of it from anywhere else, numba's when it compiles a call of BLAS included, still goes through. A
    stand-in SciPy records whether its linalg was imported."""
    import os
    import subprocess
    import sys

    linalg = tmp_path / "scipy" / "linalg"
    linalg.mkdir(parents=True)
    (tmp_path / "scipy" / "__init__.py").write_text('__version__ = "1.17.0"\n')
    (linalg / "__init__.py").write_text("import os\nopen(os.environ['MARK'], 'a').write('imported ')\n")
    (linalg / "cython_blas.py").write_text("")
    start = ("import numba\nfrom numba.core.registry import cpu_target\n"
             "cpu_target.target_context.refresh()\nimport numba.np.arraymath as m, sys\n"
             "print(m._HAVE_BLAS, 'scipy.linalg' in sys.modules)\nimport scipy.linalg")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]), "MARK": str(tmp_path / "mark")}
    for first, said in (("import streamer", "False False"), ("", "True True")):  # with streamer, without
        (tmp_path / "mark").write_text("")
        out = subprocess.run([sys.executable, "-c", f"{first}\n{start}"],
                             capture_output=True, text=True, check=True, env=env)  # fmt: skip
        assert out.stdout.split() == said.split()
        assert (tmp_path / "mark").read_text() == "imported "  # the last line's import, or numba's check's


def test_version_answers_without_importing_the_commands():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "streamer", "--version"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("streamer ")
    assert "numba" not in out.stderr and "streamer.commands." not in out.stderr


def test_an_unknown_flag_shows_the_commands_own_usage(capsys):
    from streamer.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["meth-freq", "--bogus", "calls.tsv"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("usage: streamer meth-freq") and "unrecognized arguments: --bogus" in err


def test_keys_list_says_when_there_are_none(tmp_path, capsys):
    from streamer.cli import main

    assert main(["keys", "--dir", str(tmp_path), "list"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"no keys in {tmp_path}: make one with `streamer keys generate NAME`\n"


def test_the_daemon_settles_its_heap_before_it_takes_files():
    """`streamer run` imports the signal readers' libraries and freezes what its start-up made before the
    daemon runs: the collector's full passes then walk only what the run makes. In a process of its own,
    as the freeze is for the process's life."""
    import subprocess
    import sys

    probe = ("import gc, sys\n"
             "from streamer.commands.run import settle\n"
             "before = gc.get_freeze_count(); settle()\n"
             "print(before, gc.get_freeze_count() > 10_000, 'pod5' in sys.modules, 'pyslow5' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "True", "True", "True"]
