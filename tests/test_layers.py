"""Dependencies run one way: every import of every module checked against the layer table in
docs/design.md (core <- gpu <- plugins; inside the core, lower layers only), and no import cycle,
also among the modules of one package or one entry of the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"streamer": ROOT, "streamer_gpu": ROOT / "gpu", "streamer_plugins": ROOT / "plugins"}
TOP = {"gpu": "streamer_gpu", "plugins": "streamer_plugins"}


def _layers() -> tuple[dict[str, int], dict[str, int]]:
    """(core module or package -> layer, top package -> the highest core layer it may use), from the doc."""
    text = (ROOT / "docs" / "design.md").read_text()
    core, tops = {}, {}
    for layer, cells in re.findall(r"^\| (\d+|gpu|plugins) \| (.+) \|$", text, re.M):
        if layer.isdigit():
            for name in re.findall(r"`([\w.]+)`", cells):
                core[name if name == "streamer" else f"streamer.{name}"] = int(layer)
        else:
            tops[TOP[layer]] = int(re.search(r"up to layer (\d+)", cells).group(1))
    return core, tops


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, base in PACKAGES.items():
        for f in (base / pkg).rglob("*.py"):
            parts = list(f.relative_to(base).with_suffix("").parts)
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports, wherever in the file (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            if not all(n in modules for n in names):  # `from pkg import sub` imports sub, not pkg's own names
                names.append(node.module)
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def _placed(module: str, core: dict[str, int]) -> str | None:
    """The table entry a core module falls under: itself, or the package holding it."""
    while module:
        if module in core:
            return module
        module = module.rpartition(".")[0]
        if module == "streamer":  # the root package is an entry of its own, not a catch-all
            return None
    return None


def test_every_import_goes_down_the_layers():
    core, tops = _layers()
    modules = _modules()
    unplaced = sorted(m for m in modules if m.split(".")[0] == "streamer" and _placed(m, core) is None)
    assert not unplaced, f"place these modules in the layer table of docs/design.md: {unplaced}"
    wrong = []
    for module, path in modules.items():
        top = module.split(".")[0]
        for target in _imports(path, modules):
            target_top = target.split(".")[0]
            if top == "streamer":
                if target_top != "streamer":
                    wrong.append(f"{module} imports {target}: the core reaches {target_top} only through "
                                 "gpu_api or the registry")  # fmt: skip
                    continue
                mine, theirs = _placed(module, core), _placed(target, core)
                if mine != theirs and core[theirs] >= core[mine] and theirs != "streamer":
                    wrong.append(f"{module} (layer {core[mine]}) imports {target} (layer {core[theirs]})")
            elif target_top == "streamer":
                if core[_placed(target, core)] > tops[top]:
                    wrong.append(f"{module} imports {target}, above layer {tops[top]}")
            elif top == "streamer_gpu" and target_top == "streamer_plugins":
                wrong.append(f"{module} imports {target}: gpu is below plugins")
    assert not wrong, "\n".join(wrong)


def test_the_table_names_only_modules_that_exist():
    core, _ = _layers()
    modules = _modules()
    assert sorted(name for name in core if name not in modules) == []


def test_no_import_cycles():
    modules = _modules()
    graph = {m: sorted(_imports(path, modules) - {m}) for m, path in modules.items()}
    done: set[str] = set()
    path: list[str] = []

    def cycle_from(module: str) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        path.append(module)
        for target in graph[module]:
            found = cycle_from(target)
            if found:
                return found
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        found = cycle_from(module)
        assert found is None, "import cycle: " + " -> ".join(found)
