"""What makes a plain compile start fast (issue #17) stays correct: the caches it reads are only
this user's, the catalog kept as JSON is the catalog, Check.params says what model_dump said, and a
compile whose lint results are remembered leaves the error-only and shellcheck-only modules
unimported.
No timing here: timings belong to benchmarks, not to a test that must pass on a busy machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import catalog, lint, loader, render, validate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("RB_LINT_CACHE", raising=False)
    return tmp_path / "runbook-compiler"


def test_cache_dir_is_made_private(cache_home):
    made = lint.cache_dir("jinja")
    assert made == cache_home / "jinja"
    assert made.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_cache_dir_others_can_write_is_not_used(cache_home, mode):
    (cache_home / "jinja").mkdir(parents=True)
    (cache_home / "jinja").chmod(mode)
    assert lint.cache_dir("jinja") is None


def test_cache_dir_that_is_a_link_is_not_used(cache_home, tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    cache_home.mkdir()
    (cache_home / "jinja").symlink_to(tmp_path / "elsewhere")
    assert lint.cache_dir("jinja") is None


def test_cache_dir_off(cache_home, monkeypatch):
    monkeypatch.setenv("RB_LINT_CACHE", "0")
    assert lint.cache_dir("jinja") is None
    assert not cache_home.exists()


def _catalog_text() -> str:
    return (ROOT / "compiler" / "data" / "gpus.yaml").read_text(encoding="utf-8")


def test_catalog_kept_as_json_is_the_catalog(cache_home):
    from ruamel.yaml import YAML

    text = _catalog_text()
    expected = YAML(typ="safe").load(text)["gpus"]
    assert catalog._entries(text) == expected  # read from the YAML, then kept
    kept = list((cache_home / "catalog").iterdir())
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == expected
    assert catalog._entries(text) == expected  # read from what was kept


def test_catalog_edited_or_broken_is_read_afresh(cache_home):
    text = _catalog_text()
    catalog._entries(text)
    (kept,) = (cache_home / "catalog").iterdir()
    kept.write_text("{not json")
    assert catalog._entries(text)[0]["model"] == "V100"
    edited = text.replace("model: V100\n", "model: V100X\n", 1)
    assert catalog._entries(edited)[0]["model"] == "V100X"


def test_catalog_without_a_cache(cache_home, monkeypatch):
    monkeypatch.setenv("RB_LINT_CACHE", "0")
    assert catalog._entries(_catalog_text())[0]["model"] == "V100"
    assert not cache_home.exists()


def test_one_template_environment_per_process():
    assert render.environment() is render.environment()


def _valid_specs() -> list[Path]:
    return sorted([*(ROOT / "specs").glob("*.yaml"), *(ROOT / "tests/cases/valid").glob("*.yaml")])


def test_check_params_are_what_model_dump_gave(monkeypatch):
    monkeypatch.chdir(ROOT)
    seen = set()
    for path in _valid_specs():
        source = loader.load(os.path.relpath(path), allow_abstract=True)
        if source.abstract:
            continue
        for check in validate.validate(source).checks:
            value = getattr(check, check.kind)
            dumped = (
                {"modules": list(value)}
                if isinstance(value, list)
                else value.model_dump(exclude={"allow_skip"}, exclude_none=True)
            )
            assert check.params == dumped and list(check.params) == list(dumped), path
            seen.add(check.kind)
    assert len(seen) >= 8, seen


LATE_MODULES = ("subprocess", "difflib", "traceback")


def test_a_remembered_compile_imports_no_error_or_shellcheck_modules(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), RB_LINT_CACHE="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "hostkit"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    out = str(tmp_path / "out")
    probe = (
        "import sys\nfrom compiler.cli import main\n"
        f"rc = main(['-o', {out!r}, 'specs/b300.yaml'])\n"
        f"print(rc, sorted(m for m in {LATE_MODULES!r} if m in sys.modules))\n"
    )
    first = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert first.stdout.splitlines()[-1] == "0 ['subprocess']", first.stderr  # ran shellcheck
    again = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert again.stdout.splitlines()[-1] == "0 []", again.stderr  # every result remembered
