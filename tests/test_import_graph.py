"""The package's shape: at most 10 parts at its top, no module over 600 lines, every folder importing only the folders
its own docstring's "May import" line names, and no import circle: every `import` of a gpu_bootstrap module (at the
top, inside a function, or under TYPE_CHECKING) is read from the source with ast, and the graph's strongly connected
components must all be single modules. A shared helper belongs on the floor below both of its users, not inside one
of them."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
PACKAGE = Path(__file__).resolve().parent.parent / "gpu_bootstrap"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The gpu_bootstrap modules `name` imports: `from .a import b` is module a.b when that is a module, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpu_bootstrap"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("gpu_bootstrap"):
                continue
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return {m for m in found if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_the_package_has_no_import_circle():
    found = cycles(graph())
    assert found == [], "import circles (each a group of modules that reach each other):\n" + "\n".join(
        " ↔ ".join(c) for c in found)


def test_no_module_is_over_600_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 600}
    assert long == {}, f"split these modules (a part per concern, as config/ is): {long}"


def test_the_reader_finds_a_planted_circle():
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(planted) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# --- folders and their floors -----------------------------------------------------------------------------------------
FACES = {"__init__.py", "__main__.py"}  # the package's face (its version, its docstring map) and `python -m` entry


def parts() -> list[str]:
    """The top of gpu_bootstrap/: its folders and modules, the package's two faces aside."""
    return sorted(p.name for p in PACKAGE.iterdir() if p.name not in FACES and p.name != "__pycache__")


def allowed(folder: str) -> set[str]:
    """The folders `folder`'s __init__ docstring lets it import: its "May import: a, b." line."""
    doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
    found = re.search(r"^May import: (.+?)\.$", doc, re.MULTILINE)
    assert found, f"gpu_bootstrap/{folder}/__init__.py: its docstring says what lives there, then 'May import: ...'"
    said = found.group(1)
    if said == "everything in gpu_bootstrap":
        return set(parts())
    if said == "nothing else of gpu_bootstrap":
        return set()
    return {name.strip() for name in said.split(",")}


def folder_of(module: str) -> str | None:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and (PACKAGE / pieces[1]).is_dir() else None


def crossings() -> dict[tuple[str, str], list[str]]:
    """(from folder, to folder) -> the module imports that cross between two top folders."""
    found: dict[tuple[str, str], list[str]] = {}
    for name, deps in graph().items():
        for dep in deps:
            pair = (folder_of(name), folder_of(dep))
            if None not in pair and pair[0] != pair[1]:
                found.setdefault(pair, []).append(f"{name} -> {dep}")
    return found


def test_the_top_holds_at_most_ten_parts():
    assert len(parts()) <= 10, f"{len(parts())} parts at the top of gpu_bootstrap/: {parts()}"
    assert all((PACKAGE / name).is_dir() for name in parts()), "a module at the top belongs in one of the folders"


def test_each_folder_imports_only_what_its_docstring_allows():
    rules = {folder: allowed(folder) for folder in parts()}
    for folder, names in rules.items():
        assert names <= set(parts()), f"{folder}: its 'May import' line names no folder {names - set(parts())}"
    broken = {pair: lines for pair, lines in crossings().items() if pair[1] not in rules[pair[0]]}
    assert broken == {}, "imports a folder's docstring does not allow:\n" + "\n".join(
        f"{a} -> {b}: {lines}" for (a, b), lines in sorted(broken.items()))


def test_the_floors_form_no_circle_between_folders():
    """The allowed imports themselves must order the folders into floors: no two folders may import each other."""
    rules = {folder: allowed(folder) - {folder} for folder in parts()}
    assert cycles(rules) == []


def test_the_pure_folders_stay_pure_and_no_step_knows_the_cli():
    """The rules held before the folders had docstrings: render/ and probes/ import no adapter, pipeline, step or
    command; steps/ know no application layer and no CLI; nothing but `python -m` imports the CLI."""
    for pure in ("render", "probes"):
        assert allowed(pure) <= {"core", "security"}, pure
    assert not allowed("steps") & {"app", "cli"}
    assert [pair for pair in crossings() if pair[1] == "cli"] == []


def test_the_folder_rules_catch_a_planted_crossing(monkeypatch):
    """The reader finds an import the docstring does not allow (render/ importing an adapter)."""
    import sys
    planted = {"gpu_bootstrap.render.x": {"gpu_bootstrap.adapters.kube"}}
    monkeypatch.setattr(sys.modules[__name__], "graph", lambda: planted)
    assert crossings() == {("render", "adapters"): ["gpu_bootstrap.render.x -> gpu_bootstrap.adapters.kube"]}
    assert "adapters" not in allowed("render")
