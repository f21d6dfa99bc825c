"""No import circles among the repository's own modules.

The graph is read from the source (ast), not by importing: every `import` and `from ... import`
in a module counts, at the top level and inside functions alike, since a function-level import
that closes a circle only hides it until that function runs. A module importing another that
imports it back (directly or through others) fails the test, naming the circle.

Edges go to the module named: `from . import api` is an edge to `mcr.api`, `import mcr` and
`from mcr import x` (x not a module) are edges to the package `mcr` (its __init__). The parent
packages Python imports on the way are not counted: every submodule would otherwise import its
package's front door.
"""

from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("mcr", "launch", "apps", "bapipe")


def modules(root: str = REPO, packages=PACKAGES) -> dict:
    """Dotted module name -> file path, for every .py file under the packages."""
    found = {}
    for package in packages:
        for directory, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                parts = os.path.relpath(os.path.join(directory, name), root)[: -len(".py")].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = os.path.join(directory, name)
    return found


def _resolve(name: str, known) -> str | None:
    """The longest prefix of `name` that is one of ours (None: an outside module)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module: str, path: str, known) -> set:
    """The modules of ours that `module` imports anywhere in its source."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` names the submodule when there is one, else pkg itself
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out.update(r for r in (_resolve(n, known) for n in names) if r and r != module)
    return out


def import_graph(root: str = REPO, packages=PACKAGES) -> dict:
    known = modules(root, packages)
    return {m: imports_of(m, p, known) for m, p in sorted(known.items())}


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each as a list."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _path_within(graph: dict, component: list) -> list:
    """One circle through the component's first module, for the failure message."""
    start, inside = component[0], set(component)
    previous, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w == start:
                    path = [v]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "mcr"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import x\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\nimport os\n")
    graph = import_graph(str(tmp_path), ("mcr",))
    assert graph == {"mcr": {"mcr.a"}, "mcr.a": {"mcr.sub.b"}, "mcr.sub": set(), "mcr.sub.b": {"mcr.a"}}
    assert cycles(graph) == [["mcr.a", "mcr.sub.b"]]


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    circles = [" -> ".join(_path_within(graph, c)) for c in cycles(graph)]
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_installed_packages_import_nothing_that_is_not_installed():
    # pyproject installs mcr and bapipe only: an import of launch/ or apps/ works from a
    # checkout and fails with ImportError once installed
    graph = import_graph()
    wrong = sorted(
        f"{m} imports {d}"
        for m, deps in graph.items()
        if m.split(".")[0] in ("mcr", "bapipe")
        for d in deps
        if d.split(".")[0] in ("launch", "apps")
    )
    assert not wrong, wrong


def test_the_runtime_imports_no_tool():
    # mcr/tools/ are commands on the runtime; the runtime never needs one of them
    graph = import_graph()
    wrong = sorted(
        f"{m} imports {d}"
        for m, deps in graph.items()
        if not m.startswith("mcr.tools")
        for d in deps
        if d.startswith("mcr.tools")
    )
    assert not wrong, wrong
