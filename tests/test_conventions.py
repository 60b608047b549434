"""What CONVENTIONS.md and docs/index.md state, held where a test can hold it (issue 46): the
compiler imports only rbrules of the host-side packages; docs/index.md names every page of docs/;
the README points to both; every folder CONVENTIONS.md lays out exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOST_PACKAGES = {p.name for p in (ROOT / "hostkit").iterdir() if (p / "__init__.py").is_file()}


def imported(path: Path) -> set[str]:
    """The top-level names of every absolute import in `path` (any depth in the file)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_compiler_imports_only_rbrules_of_the_host_packages():
    assert {"rbkit", "rbprobes", "rbrules", "rbview"} <= HOST_PACKAGES
    for path in sorted((ROOT / "compiler").rglob("*.py")):
        wrong = imported(path) & (HOST_PACKAGES - {"rbrules"})
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}: only rbrules"


def test_docs_index_names_every_page():
    index = (ROOT / "docs/index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#]+)\)", index))
    pages = {p.name for p in (ROOT / "docs").iterdir() if p.suffix in (".md", ".json")}
    assert pages - {"index.md"} <= linked, sorted(pages - linked - {"index.md"})
    for target in linked:
        assert (ROOT / "docs" / target).exists(), target
    reference, notebooks = index.split("## Lab notebooks")
    assert "design.md" in reference and "benchmarks.md" in notebooks and "h200.md" in notebooks


def test_the_readme_points_to_the_index_and_the_conventions():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`docs/index.md`" in readme and "`CONVENTIONS.md`" in readme


def test_the_conventions_name_what_is_there():
    text = (ROOT / "CONVENTIONS.md").read_text(encoding="utf-8")
    assert "STYLE.md" not in text
    for folder in re.findall(r"^\| `([a-z]+)/` \|", text, re.M):
        assert (ROOT / folder).is_dir(), folder
    fetched = {"benchmarks/device/debs"}  # git-ignored: fetch_debs.sh makes it
    for path in re.findall(r"`((?:benchmarks|tests|docs|hostkit)/[A-Za-z0-9_./-]+)`", text):
        assert path in fetched or (ROOT / path.rstrip("/")).exists(), path
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text("utf-8"), re.M))
    assert set(re.findall(r"`make ([a-z-]+)`", text)) <= targets
