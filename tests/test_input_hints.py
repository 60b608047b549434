"""Hints at the input (issue #18): what a user wrote is quoted back as written, GPU names as
nvidia-smi prints them, lists, ssh addresses, tabs, node sets (ClusterShell), and the ssh options a
spec may set (issue #15 M1). The error texts themselves are golden cases in tests/cases/invalid/."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler import loader, validate
from compiler.errors import SpecError

HOSTS = """hosts:
  src: {ssh: root@src.example}
  dst: {ssh: root@dst.example}
transfer:
  from: src:/opt/venv
  to: dst:/opt/venv
"""


def problems(tmp_path: Path, text: str, files: dict[str, str] | None = None) -> list[str]:
    for name, body in (files or {}).items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    spec = tmp_path / "s.yaml"
    spec.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as exc:
        validate.validate(loader.load(str(spec)))
    return exc.value.lines()


# -- numbers where strings belong: quoted as written ----------------------------------------------


@pytest.mark.parametrize("written, read", [("12.10", "12.1"), ("13.0", "13.0"), ("12", "12"),
                                           ("2.10", "2.1")])
def test_a_number_is_quoted_back_as_it_was_written(tmp_path, written, read):
    lines = problems(tmp_path, f"name: v\n{HOSTS}cuda:\n  version: {written}\n  home: /usr/cuda\n")
    assert len(lines) == 1
    assert f'write it in quotes, e.g. "{written}"' in lines[0]
    if written != read:
        assert f"(YAML reads {written} as the number {read})" in lines[0]


def test_a_number_in_a_base_is_quoted_from_the_base(tmp_path):
    base = f"abstract: true\n{HOSTS}cuda: {{version: 12.10, home: /usr/cuda}}\n"
    lines = problems(tmp_path, "extends: base.yaml\nname: child\n", {"base.yaml": base})
    assert lines[0].startswith(f"{tmp_path}/base.yaml:8:17: cuda.version:")
    assert '"12.10"' in lines[0]


# -- a string where a list belongs -----------------------------------------------------------------


@pytest.mark.parametrize("entry, hint", [  # HOSTS ends inside transfer:
    ('  exclude: "__pycache__"', 'transfer.exclude: must be a list: write exclude: ["__pycache__"]'),
    ("  exclude: __pycache__, .git", 'write exclude: ["__pycache__", ".git"]'),
    ("checks:\n  - imports: torch", 'checks[0].imports: must be a list: write imports: ["torch"]'),
    ("cuda: {version: '13.0', home: /usr/cuda, library_path_first: nvidia/cu13/lib}",
     'write library_path_first: ["nvidia/cu13/lib"]'),
])
def test_a_string_where_a_list_belongs_shows_the_list_form(tmp_path, entry, hint):
    lines = problems(tmp_path, f"name: l\n{HOSTS}{entry}\n")
    assert len(lines) == 1 and hint in lines[0], lines
