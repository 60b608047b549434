"""Templating new clusters: `extends:`, the GPU catalog and its warnings, `compile --new`,
`--schema`, `--plan`, and the pre-commit hook (docs/templating.md)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from compiler import catalog, cli, loader, schema, validate
from compiler.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

BASE = """abstract: true
description: the base
hosts:
  src: {ssh: root@src.example, port: 2200}
transfer:
  from: src:/opt/venv
  exclude: ["__pycache__", "*.pyc"]
  on_existing: backup
cuda: {version: "13.0", home: /usr/local/cuda-13.0}
gpu: {model: B300, count: 8}
checks:
  - torch: {version: "2.11.0"}
"""
CHILD = """extends: base.yaml
name: child
hosts:
  src: {port: 22}
  dst: {ssh: root@dst.example}
transfer:
  to: dst:/opt/venv
"""


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


def compile_(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def spec_of(path: str):
    source = loader.load(path)
    return source, validate.validate(source)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, {"specs/base.yaml": BASE, "specs/child.yaml": CHILD})
    return tmp_path


# -- extends: merging ---------------------------------------------------------------------------


def test_mappings_merge_key_by_key_and_the_extending_spec_wins(project):
    _source, spec = spec_of("specs/child.yaml")
    assert spec.hosts["src"].ssh == "root@src.example" and spec.hosts["src"].port == 22
    assert spec.hosts["dst"].ssh == "root@dst.example"
    assert spec.transfer.from_ == "src:/opt/venv" and spec.transfer.to == "dst:/opt/venv"
    assert spec.transfer.on_existing == "backup"
    assert spec.gpu.model == "B300" and spec.description == "the base"


def test_lists_replace_unless_tagged_append(project):
    write(
        project,
        {
            "specs/child.yaml": CHILD
            + """  exclude: ["*.a"]
checks: !append
  - nccl: {}
"""
        },
    )
    _source, spec = spec_of("specs/child.yaml")
    assert spec.transfer.exclude == ["*.a"]
    assert [c.kind for c in spec.checks] == ["torch", "nccl"]
    write(project, {"specs/child.yaml": CHILD + '  exclude: !append ["*.a"]\n'})
    _source, spec = spec_of("specs/child.yaml")
    assert spec.transfer.exclude == ["__pycache__", "*.pyc", "*.a"]


def test_null_in_the_extending_spec_clears_an_optional_section(project):
    write(project, {"specs/child.yaml": CHILD + "gpu: null\ncuda:\n"})
    _source, spec = spec_of("specs/child.yaml")
    assert spec.gpu is None and spec.cuda is None


def test_a_chain_of_three_and_its_digest_covers_every_file(project):
    write(
        project,
        {
            "specs/mid.yaml": "extends: base.yaml\nabstract: true\ntransfer: {jobs: 3}\n",
            "specs/leaf.yaml": CHILD.replace("base.yaml", "mid.yaml"),
        },
    )
    source, spec = spec_of("specs/leaf.yaml")
    assert source.chain == ("specs/leaf.yaml", "specs/mid.yaml", "specs/base.yaml")
    assert spec.transfer.jobs == 3 and spec.transfer.on_existing == "backup"
    digests = [hashlib.sha256((project / p).read_bytes()).hexdigest() for p in source.chain]
    assert source.sha256 == hashlib.sha256("\n".join(digests).encode()).hexdigest()
    write(project, {"specs/base.yaml": BASE + "# a comment changes the digest\n"})
    assert loader.load("specs/leaf.yaml").sha256 != source.sha256


def test_a_spec_that_extends_nothing_keeps_its_own_digest(project):
    source = loader.load("specs/base.yaml", allow_abstract=True)
    assert source.sha256 == hashlib.sha256((project / "specs/base.yaml").read_bytes()).hexdigest()
    assert source.chain == ("specs/base.yaml",) and source.abstract


# -- extends: errors point at the file that holds the mistake -----------------------------------


def problems(path: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        validate.validate(loader.load(path))
    return [str(p) for p in info.value.problems]


def test_a_mistake_in_the_base_points_at_the_base_and_one_in_the_child_at_the_child(project):
    write(
        project,
        {
            "specs/base.yaml": BASE.replace('"*.pyc"]', '"*.pyc", "-x"]'),
            "specs/child.yaml": CHILD.replace("{port: 22}", "{prot: 22}"),
        },
    )
    assert problems("specs/child.yaml") == [
        "specs/base.yaml:7:37: transfer.exclude[2]: must not start with '-'",
        "specs/child.yaml:4:9: hosts.src.prot: unknown key 'prot'; did you mean 'port'?",
    ]


def test_an_appended_item_is_located_in_the_extending_file(project):
    write(project, {"specs/child.yaml": CHILD + '  exclude: !append ["ok", "-bad"]\n'})
    assert problems("specs/child.yaml") == [
        "specs/child.yaml:8:27: transfer.exclude[3]: must not start with '-'"
    ]


def test_a_cycle_names_the_chain(project):
    write(project, {"specs/a.yaml": "extends: b.yaml\n", "specs/b.yaml": "extends: a.yaml\n"})
    assert problems("specs/a.yaml") == [
        "specs/b.yaml:1:10: extends: cycle: specs/a.yaml -> specs/b.yaml -> specs/a.yaml"
    ]
    write(project, {"specs/self.yaml": "extends: self.yaml\nname: x\n"})
    assert problems("specs/self.yaml") == [
        "specs/self.yaml:1:10: extends: cycle: specs/self.yaml -> specs/self.yaml"
    ]


def test_a_missing_base_suggests_a_near_name(project):
    write(project, {"specs/child.yaml": CHILD.replace("base.yaml", "bsae.yaml")})
    assert problems("specs/child.yaml") == [
        "specs/child.yaml:1:10: extends: no such file: specs/bsae.yaml; did you mean 'base.yaml'?"
    ]


def test_a_syntax_error_in_the_base_is_reported_in_the_base(project):
    write(project, {"specs/base.yaml": "hosts: [\n"})
    [only] = problems("specs/child.yaml")
    assert only.startswith("specs/base.yaml:2:1: YAML syntax error")


@pytest.mark.parametrize(
    "value, message",
    [
        ("42", "must be the path of the base spec"),
        ("/srv/base.yaml", "must be relative to this file's folder"),
    ],
)
def test_extends_must_be_a_relative_path(project, value, message):
    write(project, {"specs/child.yaml": CHILD.replace("base.yaml", value)})
    [only] = problems("specs/child.yaml")
    assert only.startswith("specs/child.yaml:1:10: extends: ") and message in only


def test_runbook_step_pointers_stay_inside_the_compiled_file(project):
    source = loader.load("specs/child.yaml")
    assert source.locate(("checks",), key=True) == ("specs/base.yaml", 11, 1)
    assert source.position(("checks",), key=True) == (1, 1)
    assert source.position(("transfer", "to"), key=True) == (7, 3)
    assert source.origin(("hosts", "src", "ssh")) == "specs/base.yaml"
    assert source.origin(("hosts", "src", "port")) == "specs/child.yaml"


# -- abstract bases and the CLI -----------------------------------------------------------------


def test_a_directory_compile_skips_bases_and_check_catches_drift_from_the_base(project):
    code, out, err = compile_("specs")
    assert code == 0, err
    assert "skipped specs/base.yaml" in out
    assert sorted(p.name for p in (project / "generated").iterdir()) == [".kit", "child.sh"]
    header = (project / "generated/child.sh").read_text().splitlines()[1]
    assert header.startswith("# @generated from specs/child.yaml (sha256 ")
    assert compile_("--check")[0] == 0
    write(project, {"specs/base.yaml": BASE.replace("backup", "replace")})
    code, _out, err = compile_("--check")
    assert code == 4 and "generated/child.sh: differs from specs/child.yaml" in err


def test_naming_a_base_explicitly_is_an_error(project):
    code, _out, err = compile_("specs/base.yaml")
    assert code == 2
    assert err.startswith("specs/base.yaml:1:1: abstract: this spec is a base (abstract: true)")
    assert not (project / "generated").exists()


def test_a_mistake_in_a_shared_base_is_reported_once(project):
    write(
        project,
        {
            "specs/base.yaml": BASE.replace("on_existing", "on_exsting"),
            "specs/other.yaml": CHILD.replace("name: child", "name: other"),
        },
    )
    code, _out, err = compile_("specs")
    assert code == 2
    assert err.count("transfer.on_exsting:") == 1 and "1 problem;" in err


# -- the GPU catalog ----------------------------------------------------------------------------

REQUIRED = {
    "A100": "8.0",
    "H100": "9.0",
    "H200": "9.0",
    "GH200": "9.0",
    "B200": "10.0",
    "GB200": "10.0",
    "B300": "10.3",
    "GB300": "10.3",
    "RTX-PRO-6000": "12.0",
}


@pytest.mark.parametrize("model, capability", sorted(REQUIRED.items()))
def test_the_catalog_knows_the_models_people_run(model, capability):
    gpu = catalog.lookup(model)
    assert gpu is not None and gpu.capability == capability
    assert gpu.arch == catalog.arch_of(capability) == "sm_" + capability.replace(".", "")
    assert gpu.arch_name and gpu.family.startswith("sm_") and gpu.per_node >= 1
    assert catalog.version_tuple(gpu.min_cuda) >= (11, 0)


def test_model_names_match_without_case_or_separators():
    assert catalog.lookup("rtx pro 6000 blackwell").name == "RTX-PRO-6000"
    assert catalog.lookup("hgx_b300").name == "B300"
    assert catalog.lookup("b30") is None


def test_the_catalog_file_ships_in_the_package():
    assert (ROOT / "compiler" / "data" / "gpus.yaml").is_file()
    assert len(catalog.models()) >= len(REQUIRED)


@pytest.mark.parametrize(
    "cuda, model, expected",
    [
        ("12.4", "B300", "CUDA 12.4 cannot target sm_103 (B300); needs 12.9 or later"),
        ("12.8", "B200", None),
        (
            "13.0",
            "V100",
            "CUDA 13.0 cannot target sm_70 (V100); CUDA 12.9 was the last release to support it",
        ),
        ("12.9", "V100", None),
    ],
)
def test_cuda_rules(cuda, model, expected):
    assert catalog.cuda_problem(cuda, catalog.lookup(model)) == expected


def test_a_torch_that_cannot_serve_the_gpu_is_a_warning_and_the_compile_succeeds(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)
    code, _out, err = compile_("tests/cases/valid/catalog_torch_warning.yaml", "-o", str(tmp_path))
    assert code == 0
    assert err == (
        "tests/cases/valid/catalog_torch_warning.yaml:12:37: warning: "
        "checks[0].torch.cuda: a torch built for CUDA 12.4 has no code for sm_103 "
        "(B300): needs 12.9 or later; expect the checks to fail on dst\n"
    )
    assert (tmp_path / "catalog_torch_warning.sh").exists()


# -- compile --new ------------------------------------------------------------------------------


def test_new_writes_a_marked_copy_that_compiles_once_edited(project):
    write(project, {"specs/b300.yaml": (ROOT / "specs/b300.yaml").read_text()})
    code, out, err = compile_("--new", "h100-b", "--from", "specs/b300.yaml")
    assert code == 0, err
    new = project / "specs/h100-b.yaml"
    text = new.read_text()
    assert "name: h100-b\n" in text and "# The seed scenario" in text  # comments are kept
    marked = [line for line in text.splitlines() if "TODO(change me)" in line]
    assert len(marked) == 7 and "specs/h100-b.yaml:10:10: hosts.b300.ssh" in out
    # editors find the schema without this repository: written beside the spec, named on line 1
    assert text.startswith("# yaml-language-server: $schema=runbook-spec.schema.json\n")
    assert json.loads((project / "specs/runbook-spec.schema.json").read_text())["title"]
    code, _out, err = compile_("specs/h100-b.yaml")
    assert code == 2 and err.count("marked TODO(change me)") == 7
    assert not (project / "generated").exists()
    new.write_text(text.replace("# TODO(change me)", "").replace("b300.lab", "h100-b.lab"))
    code, _out, err = compile_("specs/h100-b.yaml")
    assert code == 0, err


def test_new_keeps_extends_and_marks_what_the_file_holds(project):
    code, out, err = compile_("--new", "child2", "--from", "specs/child.yaml")
    assert code == 0, err
    data = YAML(typ="safe").load((project / "specs/child2.yaml").read_text())
    assert data["extends"] == "base.yaml" and data["name"] == "child2"
    assert [line.split(": ")[-1] for line in out.splitlines()[1:]] == [
        "hosts.dst.ssh",
        "transfer.to",
    ]


def test_new_refuses_to_overwrite_and_needs_a_cluster_to_start_from(project):
    assert compile_("--new", "child", "--from", "specs/child.yaml")[0] == 64
    code, _out, err = compile_("--new", "x", "--from", "specs/base.yaml")
    assert code == 64 and "e.g. --from specs/child.yaml" in err
    assert compile_("--new", "Bad Name", "--from", "specs/child.yaml")[0] == 64
    assert compile_("--from", "specs/child.yaml")[0] == 64
    assert compile_("--from", "specs/child.yaml")[0] == 64
    assert sorted(p.name for p in (project / "specs").iterdir()) == ["base.yaml", "child.yaml"]


# -- compile --schema ---------------------------------------------------------------------------


def test_the_committed_schema_is_up_to_date():
    code, out, _err = compile_("--schema")
    assert code == 0
    assert (ROOT / "docs/spec.schema.json").read_text(encoding="utf-8") == out, (
        "docs/spec.schema.json is stale: run  python -m compiler --schema > docs/spec.schema.json"
    )


def _validator():
    try:
        import jsonschema
    except ImportError:
        if IN_CI:
            pytest.fail(
                "jsonschema is not installed: it is in the test extras (pip install -e .[test])"
            )
        pytest.skip("jsonschema is not installed")
    return jsonschema.Draft202012Validator(schema.build())


SPECS = sorted((ROOT / "specs").glob("*.yaml")) + sorted(
    (ROOT / "tests/cases/valid").glob("*.yaml")
)


@pytest.mark.parametrize("path", SPECS, ids=[p.relative_to(ROOT).as_posix() for p in SPECS])
def test_every_spec_validates_against_the_schema(path):
    validator = _validator()
    data = loader.plain(loader.parse(str(path)).data)
    assert [e.message for e in validator.iter_errors(data)] == []


def test_the_schema_requires_what_a_whole_spec_needs_but_not_what_a_base_provides():
    validator = _validator()
    partial = {"extends": "base.yaml", "name": "x", "transfer": {"to": "dst:/opt/venv"}}
    assert list(validator.iter_errors(partial)) == []
    whole = {"name": "x", "hosts": {"h": {"local": True}}, "transfer": {"to": "h:/opt/venv"}}
    assert [e.message for e in validator.iter_errors(whole)] == ["'from' is a required property"]
    typo = dict(partial, transfer={"to": "dst:/x", "rout": "relay"})
    assert "'rout' was unexpected" in next(validator.iter_errors(typo)).message


def test_the_example_specs_name_the_schema():
    for name in ("base", "cluster-h100", "cluster-b200"):
        first = (ROOT / "specs" / f"{name}.yaml").read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../docs/spec.schema.json"


# -- compile --plan -----------------------------------------------------------------------------


def test_plan_says_what_happens_where(project):
    write(project, {"specs/child.yaml": CHILD + 'env: {NCCL_DEBUG: "INFO"}\n'})
    code, out, err = compile_("--plan", "specs/child.yaml")
    assert code == 0, err
    assert out.startswith("## Runbook plan: `child`")
    assert "(extends `specs/base.yaml`)" in out
    for part in (
        "### Hosts",
        "| `dst` | destination | ssh `root@dst.example`",
        "route **relay**",
        "- `__pycache__`",
        "Not known at compile time",
        "`NCCL_DEBUG=INFO`",
        "GPU expected: 8 x `B300`, compute capability 10.3",
        "| 1 | torch | version=`2.11.0` | fails |",
        "1. **preflight**",
        "9. **probe**",
    ):
        assert part in out, part
    assert not (project / "generated").exists()


def test_plan_stays_short_for_a_huge_spec(project):
    excludes = ", ".join(f'"pattern-{i}-*.so"' for i in range(3000))
    checks = "".join(
        f"  - command: {{name: c{i}, run: {json.dumps('echo ' + 'x' * 3000)}}}\n" for i in range(60)
    )
    env = "".join(f"  V{i}: value-{i}\n" for i in range(2000))
    write(
        project,
        {
            "specs/big.yaml": CHILD.replace("name: child", "name: big")
            + f"  exclude: [{excludes}]\nchecks:\n{checks}env:\n{env}"
        },
    )
    code, out, err = compile_("--plan", "specs/big.yaml")
    assert code == 0, err
    assert len(out) < 40_000
    assert "... and 2960 more" in out and "... and 20 more checks" in out


def test_plan_of_a_wrong_spec_lists_its_problems(project):
    write(project, {"specs/child.yaml": CHILD + "  rout: relay\n"})
    code, out, err = compile_("--plan", "specs/child.yaml")
    assert code == 2 and out == ""
    assert "specs/child.yaml:8:3: transfer.rout: unknown key 'rout'; did you mean 'route'?" in err


def test_modes_do_not_mix_and_bad_flags_are_usage_errors(project):
    assert compile_("--plan", "specs/child.yaml", "specs/child.yaml")[0] == 64
    assert compile_("--plan", "specs/child.yaml", "--check")[0] == 64
    assert compile_("--frobnicate")[0] == 64
    assert compile_("--plan", "specs/nope.yaml")[0] == 64


# -- the pre-commit hook ------------------------------------------------------------------------


def test_the_pre_commit_hook_runs_the_drift_check():
    [hook] = YAML(typ="safe").load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["entry"] == "compile --check" and hook["pass_filenames"] is False
    assert hook["language"] == "python"


def test_the_docs_list_every_catalog_model():
    doc = (ROOT / "docs/templating.md").read_text(encoding="utf-8")
    for gpu in catalog.models():
        row = (
            f"| {gpu.name} | {gpu.capability} | {gpu.arch} | {gpu.arch_name} | {gpu.family} | "
            f"{gpu.min_cuda} | {gpu.max_cuda or '-'} | {gpu.per_node} |"
        )
        assert row in doc, f"docs/templating.md: the catalog table lacks or misstates {gpu.name}"
