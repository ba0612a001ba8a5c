"""The wheel must hold every package and the pore models, not only the editable checkout."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setuptools():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_is_declared():
    st = _setuptools()
    dirs = {name: Path(path) for name, path in st["package-dir"].items()}
    declared = set(st["packages"])
    found = set()
    for top in ("streamer", "gpu", "plugins"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            # the longest package-dir entry that contains this folder names it
            name, base = max(((n, d) for n, d in dirs.items() if rel == d or d in rel.parents),
                             key=lambda nd: len(nd[1].parts))
            found.add(".".join([name, *rel.relative_to(base).parts]))
    assert found == declared


def test_models_ship_as_package_data():
    data = _setuptools()["package-data"]["streamer"]
    assert "data/models/*" in data
    models = ROOT / "streamer" / "data" / "models"
    assert (models / "LICENSE").is_file() and len(list(models.glob("*.model"))) == 2
