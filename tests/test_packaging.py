"""The wheel, as a user installs it: every package and the pore models, and the README example
run from inside the checkout (where same-named folders could shadow the installed package)
and from elsewhere."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ECOLI, REFERENCE

ROOT = Path(__file__).resolve().parents[1]
IMPORT_ROOTS = {"streamer": ROOT, "streamer_gpu": ROOT / "gpu", "streamer_plugins": ROOT / "plugins"}


def _packages_in_checkout() -> set[str]:
    found = set()
    for name, base in IMPORT_ROOTS.items():
        for init in (base / name).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(base).parts))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True)
    (path,) = out.glob("streamer-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment holding only the wheel; the test environment's packages
    (numpy, numba, pysam...) reached through a .pth line, so nothing is downloaded. The test
    environment's own editable install is not seen: a path added by a .pth line is not a site
    folder, so its .pth files (the editable finder) are not read."""
    env = tmp_path_factory.mktemp("env") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, capture_output=True)
    python = env / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "streamer-test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return env


def test_the_wheel_holds_every_package_and_the_models(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = {".".join(Path(n).parent.parts) for n in names if n.endswith("/__init__.py")}
    assert packages == _packages_in_checkout()
    models = [n for n in names if n.startswith("streamer/data/models/")]
    assert "streamer/data/models/LICENSE" in models and sum(n.endswith(".model") for n in models) == 6
    assert not any(n.startswith(("tests/", "gpu/", "plugins/")) for n in names)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["NUMBA_CACHE_DIR"] = os.environ.get("NUMBA_CACHE_DIR", "")  # keep a user's choice, else numba's default
    if not env["NUMBA_CACHE_DIR"]:
        del env["NUMBA_CACHE_DIR"]
    return env


def test_the_readme_example_runs_from_the_checkout_and_from_elsewhere(installed, tmp_path):
    """From inside the checkout the reader processes must import the installed package, not the
    checkout's folders; the output is the same wherever it is run from."""
    streamer = installed / "bin" / "streamer"
    python = installed / "bin" / "python"
    args = ["call", "-r", str(ECOLI / "reads.fasta"), "-b", str(ECOLI / "reads.bam"), "-g", str(REFERENCE),
            "--signal", str(ECOLI / "fast5"), "-t", "2"]
    outputs = {}
    for where in (ROOT, tmp_path):
        out = tmp_path / f"meth-{len(outputs)}.tsv"
        run = subprocess.run([str(streamer), *args, "-o", str(out)], cwd=where, env=_clean_env(),
                             capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stderr
        assert "Traceback" not in run.stderr
        outputs[where] = out.read_bytes()
        version = subprocess.run([str(python), "-m", "streamer", "--version"], cwd=where, env=_clean_env(),
                                 capture_output=True, text=True, timeout=120)
        assert version.returncode == 0 and version.stdout.startswith("streamer "), version.stderr
    assert outputs[ROOT] == outputs[tmp_path]
    assert outputs[ROOT].count(b"\n") > 100
