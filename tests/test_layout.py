"""The layout shows where code runs (issue #14): the compiler's modules import each other without a
cycle, host-side code never imports the compiler, and no template partial grows past ~100 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_imports(package: Path, name: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (any depth in the file)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        mod = path.stem
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:
                    deps.add(node.module.split(".")[0])
                elif node.level == 1:
                    deps.update(a.name for a in node.names)
                elif node.module and node.module.startswith(name + "."):
                    deps.add(node.module.split(".")[1])
        graph[mod] = {d for d in deps if (package / f"{d}.py").exists() and d != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                found.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_compiler_has_no_import_cycle():
    graph = module_imports(ROOT / "compiler", "compiler")
    assert "extends" in graph["loader"] and "loader" not in graph["extends"]
    assert cycles(graph) == []


def test_host_side_code_never_imports_the_compiler():
    for path in sorted((ROOT / "hostkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            assert not any(n == "compiler" or n.startswith("compiler.") for n in names), path


def test_no_template_is_over_about_a_hundred_lines():
    for path in sorted((ROOT / "templates").rglob("*.j2")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 120, f"{path.relative_to(ROOT)} has {lines} lines: split it"


def test_only_resolve_reads_the_spec():
    """Two phases (issue 35): resolve(spec) -> Plan makes every decision; the modules that make
    the runbook's texts from the Plan (the settings block, --list, --dry-run, compile --plan)
    import neither the spec's model nor the loaded spec."""
    graph = module_imports(ROOT / "compiler", "compiler")
    for text_maker in ("plan", "planmd", "steps", "render", "view"):
        assert not graph[text_maker] & {"spec", "loader", "validate"}, text_maker
    assert {"spec", "loader"} <= graph["resolve"]


HOST_PACKAGES = ("rbkit", "rbprobes", "rbrules", "rbview")


def test_no_host_package_has_an_import_cycle():
    """Issue 46: the kit's modules import each other one way (fanout.py and fanplan.py share
    fanreports.py, the low module, instead of importing each other)."""
    for name in HOST_PACKAGES:
        assert cycles(module_imports(ROOT / "hostkit" / name, name)) == [], name


def test_no_module_is_over_six_hundred_lines():
    """Issue 46: a module a reviewer reads in one sitting; split at a real seam past 600 lines."""
    over = []
    for top in ("compiler", "hostkit"):
        for path in sorted((ROOT / top).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > 600:
                over.append(f"{path.relative_to(ROOT)}: {lines}")
    assert over == []


def test_no_host_module_takes_another_ones_private_names_nor_renames_one():
    """Issue 46: a name another module uses is public in the module that owns it (no
    `from .x import _y`, no `x._y`), and a module is imported under its own name (no `import x as
    y` to dodge a clash: the clash is resolved where it is)."""
    found = []
    for path in sorted((ROOT / "hostkit").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.name}:{node.lineno}: imports {alias.name}")
                    if alias.asname and alias.asname != alias.name:
                        found.append(f"{path.name}:{node.lineno}: {alias.name} as {alias.asname}")
                    if node.level or (node.module or "").split(".")[0] in HOST_PACKAGES:
                        modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in HOST_PACKAGES:
                        modules.add(alias.asname or alias.name)
                        if alias.asname:
                            found.append(f"{path.name}:{node.lineno}: {alias.name} as ...")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert found == []
