"""The house plan, checked on the source: core is the ground floor (it imports nothing above it), no method
imports another method's folder, and core's modules import each other without a circle. Imports inside
functions count as much as those at the top of a file."""

from __future__ import annotations

import ast
from pathlib import Path

from core.registry import method_specs

ROOT = Path(__file__).resolve().parents[1]
ABOVE_CORE = ("perception", "worldmodels", "driving", "sim", "embodied", "benchmarks", "tests")


def imports(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, wherever the import stands."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_core_imports_nothing_above_it():
    bad = {f"{p.relative_to(ROOT)}: {n}" for p in (ROOT / "core").rglob("*.py") for n in imports(p)
           if n.split(".")[0] in ABOVE_CORE}
    assert not bad, sorted(bad)


def test_no_method_imports_another_method():
    folders = {s.folder.replace("/", "."): s.name for s in method_specs() if (ROOT / s.folder).is_dir()}
    assert len(folders) >= 8
    bad = []
    for package, method in folders.items():
        for p in (ROOT / package.replace(".", "/")).rglob("*.py"):
            for n in imports(p):
                other = next((q for q in folders if q != package and (n == q or n.startswith(q + "."))), None)
                if other is not None:
                    bad.append(f"{p.relative_to(ROOT)} ({method}) imports {n} ({folders[other]})")
    assert not bad, bad


def test_core_modules_form_no_import_circle():
    modules = {module_name(p): p for p in (ROOT / "core").rglob("*.py")}

    def owner(name: str) -> str | None:  # `core.data.lerobot.INFO_PATH` -> the module core.data.lerobot
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: {o for n in imports(p) if n.startswith("core") and (o := owner(n)) not in (None, m)}
             for m, p in modules.items()}
    # a package's __init__ re-exporting its children is not a circle with them (python imports the package first)
    edges = {m: {o for o in out if not (o.startswith(m + ".") and modules[m].name == "__init__.py")}
             for m, out in edges.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for o in sorted(edges[m]):
            if state.get(o) == 1:
                circles.append(stack[stack.index(o):] + [o])
            elif o not in state:
                visit(o)
        stack.pop()
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m)
    assert not circles, [" -> ".join(c) for c in circles]
