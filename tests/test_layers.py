"""The house's layers: every import goes one way, `app -> ui -> serve -> tasks -> engine -> model`,
with `train` beside serve (`train -> tasks -> engine -> model`).

Read from the code's own imports (ast), so that a newcomer who adds an import against the order
is told at once which file and line, before the arrow grows into a loop.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Each layer may import the layers below it; serve and train stand side by side and import
# neither each other. bench/ and scripts/ are tools on top of everything (a script may use a benchmark's).
RANK = {"model": 0, "engine": 1, "tasks": 2, "serve": 3, "train": 3, "ui": 4, "app": 5, "bench": 6, "scripts": 7}
# The page speaks to serve/ only: what it needs of the tasks and the engine, serve/ hands it on.
PAGE_REACHES = {"ui": {"ui", "serve"}, "app": {"ui", "serve"}}


def module_files() -> dict[str, Path]:
    """Every project module by dotted name (a package by its __init__'s)."""
    files = {"app": REPO / "app.py"}
    for layer in RANK:
        folder = REPO / layer
        if folder.is_dir():
            for path in folder.rglob("*.py"):
                parts = path.relative_to(REPO).with_suffix("").parts
                files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imports(name: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) for each project module that `path` imports, anywhere in the file (a
    function's import or one under TYPE_CHECKING is an arrow all the same)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from engine import kernels` imports the module engine.kernels where there is one
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((node.lineno, target))
    return found


def layer_of(module: str) -> str:
    return module.split(".")[0]


FILES = module_files()
GRAPH = {name: imports(name, path, set(FILES)) for name, path in FILES.items()}


def test_every_import_follows_the_order():
    wrong = []
    for name, arrows in GRAPH.items():
        layer = layer_of(name)
        for line, target in arrows:
            to = layer_of(target)
            allowed = (to == layer or RANK[to] < RANK[layer]) and to in PAGE_REACHES.get(layer, {to})
            if not allowed:
                wrong.append(f"{FILES[name].relative_to(REPO)}:{line} imports {target} ({layer} -> {to})")
    assert not wrong, "imports against app -> ui -> serve -> tasks -> engine -> model (train beside serve):\n" + \
        "\n".join(wrong)


def test_no_module_imports_itself_through_others():
    """No loop of imports, however long: a module's dependencies never lead back to it."""
    loops = set()

    def visit(name: str, path: list[str]) -> None:
        for _, target in GRAPH[name]:
            if target in path:
                loop = path[path.index(target):]
                start = loop.index(min(loop))
                loops.add(" -> ".join(loop[start:] + loop[:start] + [min(loop)]))
            elif target not in done:
                visit(target, path + [target])
        done.add(name)

    done: set[str] = set()
    for name in GRAPH:
        if name not in done:
            visit(name, [name])
    assert not loops, "import loops:\n" + "\n".join(sorted(loops))


@pytest.mark.parametrize("layer", ["ui", "serve", "tasks", "engine", "model", "train"])
def test_each_package_says_what_it_imports(layer):
    """Each package's docstring names the layers it stands on, as README's line on the layers does."""
    doc = ast.get_docstring(ast.parse((REPO / layer / "__init__.py").read_text())) or ""
    below = sorted({layer_of(target) for name, arrows in GRAPH.items() if layer_of(name) == layer
                    for _, target in arrows} - {layer})
    for other in below:
        assert f"{other}/" in doc, f"{layer}/__init__.py's docstring does not say that {layer}/ imports {other}/"


def test_the_checker_sees_a_wrong_import():
    """The reading itself: a relative import resolves to its module, and an arrow up is caught."""
    known = set(FILES)
    source = REPO / "tasks" / "base.py"
    assert (1, "engine.generate") not in imports("tasks.base", source, known)
    assert any(target == "engine.generate" for _, target in imports("tasks.base", source, known))
    assert any(target == "serve.limits" for _, target in imports("serve.running", FILES["serve.running"], known))
