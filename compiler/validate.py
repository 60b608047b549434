"""Stage 2 entry point: loaded spec -> `Spec`, or a SpecError listing every problem with its
position.

Two passes, both always run: the pydantic models (types, allowed keys, formats), then the checks
that relate fields to each other (host references, source vs target, the GPU catalog). The second
pass reads the raw data defensively so that it can report next to the first pass's problems.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import typing
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from . import fanout, gpu_rules, sshopts
from .errors import Problem, SpecError
from .fields import PLACEHOLDER, At, parse_endpoint
from .loader import Source, dotted, plain
from .spec import CHECK_TYPES, Spec


def validate(source: Source) -> Spec:
    return validate_with_warnings(source)[0]


def validate_with_warnings(source: Source) -> tuple[Spec, list[Problem]]:
    """The spec, and what is legal but doubtful (a torch that cannot serve the GPU), as problems
    the CLI prints as warnings. Raises SpecError listing every error."""
    data = plain(source.data)
    left = placeholders(source)
    problems: list[Problem] = list(source.markers)
    spec: Optional[Spec] = None
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            problems.extend(_located(source, err))
    problems.extend(_relations(source, data))
    # a placeholder is the one problem of its entry: what else is said of it follows from it
    problems = left + [p for p in problems if not any(_within(p.field, q.field) for q in left)]
    if problems:
        raise SpecError(_unique(problems))
    assert spec is not None
    return spec, (
        gpu_rules.warnings(source, spec)
        + fanout.warnings(source, spec)
        + _unproved_gpu(source, spec)
    )


def placeholders(source: Source) -> list[Problem]:
    """Every value that still holds a placeholder of `compile --new` (`<source host: CHANGE ME>`),
    in any file of the spec, each at its entry."""
    out = []

    def walk(node: Any, loc: tuple) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, loc + (key,))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, loc + (index,))
        elif isinstance(node, str):
            found = PLACEHOLDER.search(node)
            if found:
                out.append(
                    source.problem(
                        loc,
                        f"still the placeholder {found.group(0)!r} of "
                        "compile --new: write this spec's value there",
                    )
                )

    walk(plain(source.data), ())
    return out


def _within(field: str, outer: str) -> bool:
    """Whether the entry `field` (dotted) is `outer` or below it."""
    return field == outer or field.startswith((outer + ".", outer + "["))


# the checks that run on the GPU (torch fails where torch.cuda.is_available() is false), or may:
# a snippet of the spec's own is taken to know what it does
ON_THE_GPU = ("torch", "devices", "matmul", "nccl", "python", "command")


def _unproved_gpu(source: Source, spec: Spec) -> list[Problem]:
    """`gpu:` declared and no check that runs on it: a green run would say nothing of the GPU (the
    implied checks read files only)."""
    if spec.gpu is None or any(c.kind in ON_THE_GPU for c in spec.checks):
        return []
    listed = ", ".join(sorted({c.kind for c in spec.checks}))
    what = f"checks lists only {listed}" if listed else "checks is empty"
    where = ("checks",) if "checks" in source.data else ("gpu",)
    return [
        source.problem(
            where,
            (
                f"gpu: {spec.gpu.model} is declared but {what}: nothing will prove the GPU (the "
                "relocation and kernel audit the runbook adds read files only), so a green run "
                "says nothing of it; add `- devices: {}` (finds and counts the GPUs) or "
                "`- matmul: {}` (computes on each)"
            ),
            key=True,
        )
    ]


def warning_line(warning: Problem) -> str:
    """`path:line:col: warning: field: message`."""
    where = f"{warning.path}:{warning.line}:{warning.column}" if warning.line else warning.path
    field = f" {warning.field}:" if warning.field else ""
    return f"{where}: warning:{field} {warning.message}"


def _unique(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for problem in problems:
        if (problem.path, problem.line, problem.column, problem.field, problem.message) not in seen:
            seen.add((problem.path, problem.line, problem.column, problem.field, problem.message))
            out.append(problem)
    return out


# -- pydantic errors -> problems ----------------------------------------------------------------


def _located(source: Source, err: dict[str, Any]) -> list[Problem]:
    """A validator that raised `At` names the entries below its value that are wrong."""
    error = (err.get("ctx") or {}).get("error")
    if not isinstance(error, At):
        return [_translate(source, err)]
    return [
        source.problem(tuple(err["loc"]) + at, _clean(message), key=key)
        for at, message, key in error.errors
    ]


def _translate(source: Source, err: dict[str, Any]) -> Problem:
    loc = tuple(err["loc"])
    kind = err["type"]
    if loc and loc[-1] == "[key]":
        loc = loc[:-1]
        return source.problem(loc, _clean(err["msg"]), key=True)
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        hint = _did_you_mean(str(loc[-1]), allowed)
        msg = f"unknown key {loc[-1]!r}" + hint
        if not hint and allowed:
            msg += f" (allowed: {', '.join(sorted(allowed))})"
        return source.problem(loc, msg, key=True)
    if kind == "missing":
        problem = source.problem(loc[:-1], f"required key {loc[-1]!r} is missing", key=True)
        return Problem(problem.path, problem.line, problem.column, dotted(loc), problem.message)
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        options = [o.strip().strip("'") for o in expected.replace(" or ", ", ").split(",")]
        given = err.get("input")
        hint = _did_you_mean(str(given), options) if isinstance(given, str) else ""
        return source.problem(loc, f"must be one of {', '.join(options)}; got {given!r}{hint}")
    given = err.get("input")
    if kind == "string_type" and isinstance(given, (int, float)) and not isinstance(given, bool):
        return source.problem(loc, _quote_hint(source.written(loc) or str(given), given))
    if kind == "list_type" and isinstance(given, str):
        return source.problem(loc, _list_hint(loc, given))
    if kind in ("int_parsing", "int_type", "int_from_float", "float_parsing", "float_type"):
        whole = "a whole number" if kind.startswith("int") else "a number"
        return source.problem(loc, f"must be {whole}; got {_as_written(source, loc, given)}")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound = _clean(err["msg"]).replace("input should be ", "must be ", 1)
        return source.problem(loc, f"{bound}; got {_as_written(source, loc, given)}")
    if kind in ("dict_type", "model_type", "model_attributes_type") and err.get("input") is None:
        return source.problem(loc, "must not be empty: give a mapping of keys to values")
    return source.problem(loc, _clean(err["msg"]))


def _as_written(source: Source, loc: tuple, given: Any) -> str:
    """The value quoted back as the spec wrote it (`'2222x'`, `70000`, `1.50`)."""
    if isinstance(given, str):
        return repr(given)
    return source.written(loc) or str(given)


def _quote_hint(written: str, given: Any) -> str:
    """A number where a string belongs: quote it as the user wrote it (`12.10`, not the float's
    `12.1`), and say what YAML made of it when that differs."""
    if isinstance(given, float):
        why = (
            f" (YAML reads {written} as the number {given})"
            if written != str(given)
            else " (YAML reads 13.10 as the number 13.1)"
        )
    else:
        why = ""
    return f'must be a string: write it in quotes, e.g. "{written}"{why}'


def _list_hint(loc: tuple, given: str) -> str:
    """A string where a list belongs: show the list form (`exclude: ["__pycache__"]`); a string
    with commas is taken as the items it lists."""
    items = [part.strip() for part in given.split(",")] if "," in given else [given]
    key = next((str(part) for part in reversed(loc) if isinstance(part, str)), "key")
    shown = ", ".join(json.dumps(item, ensure_ascii=False) for item in items if item)
    return f"must be a list: write {key}: [{shown}]"


def _clean(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    if re.match(r"^[A-Z][a-z]+ (should|required|must)", msg):  # pydantic's own sentences
        msg = msg[:1].lower() + msg[1:]
    return msg


def _did_you_mean(word: str, options: list[str]) -> str:
    import difflib  # only a mistake needs it

    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close:
        close = [o for o in options if o.lower() == word.lower()]
    return f"; did you mean {close[0]!r}?" if close else ""


def _allowed_keys(loc: tuple) -> list[str]:
    """The keys the model at `loc` accepts (walks the model types along the location)."""
    tp: Any = Spec
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = _field(tp, str(part))
            if field is None:
                return []
            tp = field.annotation
        else:
            origin = typing.get_origin(tp)
            args = typing.get_args(tp)
            if origin in (dict,) and args:
                tp = args[1]
            elif origin in (list,) and args:
                tp = args[0]
            else:
                return []
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [f.alias or name for name, f in tp.model_fields.items()]
    return []


def _field(model: type[BaseModel], key: str):
    for name, field in model.model_fields.items():
        if (field.alias or name) == key:
            return field
    return None


def _unwrap(tp: Any) -> Any:
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin is typing.Union:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


# -- relations between fields -------------------------------------------------------------------


def _relations(source: Source, data: dict[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    hosts = data.get("hosts") if isinstance(data.get("hosts"), dict) else {}
    transfer = data.get("transfer") if isinstance(data.get("transfer"), dict) else {}
    ends: dict[str, tuple[str, str]] = {}
    for key in ("from", "to"):
        value = transfer.get(key)
        if not isinstance(value, str):
            continue
        try:
            host, path = parse_endpoint(value)
        except ValueError:
            continue  # the model reports the format
        ends[key] = (host, path)
        if host not in hosts:
            hint = _did_you_mean(host, list(hosts))
            problems.append(
                source.problem(("transfer", key), f"host {host!r} is not defined under hosts{hint}")
            )
            continue
        entry = hosts.get(host)
        is_local = isinstance(entry, dict) and entry.get("local") is True
        if path and not path.startswith("/") and not is_local:
            problems.append(
                source.problem(
                    ("transfer", key),
                    f"{path!r} must be an absolute path on {host} (relative paths are only for "
                    "`local: true` hosts, where they are taken from the directory the runbook runs "
                    "in)",
                )
            )
    if len(ends) == 2:
        (h1, p1), (h2, p2) = ends["from"], ends["to"]
        n1, n2 = _norm(p1), _norm(p2)
        if h1 == h2 and n1 == n2:
            problems.append(source.problem(("transfer", "to"), "is the same as transfer.from"))
        elif h1 == h2 and (n2.startswith(n1 + "/") or n1.startswith(n2 + "/")):
            problems.append(
                source.problem(
                    ("transfer", "to"),
                    "source and destination on one host must not contain each other",
                )
            )
        route = transfer.get("route", "relay")
        if route in ("direct", "auto") and (_is_local(hosts, h1) or _is_local(hosts, h2)):
            problems.append(
                source.problem(
                    ("transfer", "route"), f"{route} needs both ends reached over ssh; use relay"
                )
            )
        direct = transfer.get("direct")
        if isinstance(direct, dict) and direct.get("local"):
            problems.append(
                source.problem(
                    ("transfer", "direct", "local"), "the direct hop is ssh from the source host"
                )
            )
        if isinstance(direct, dict) and direct.get("ssh_config"):
            problems.append(
                source.problem(
                    ("transfer", "direct", "ssh_config"),
                    "the direct hop is the source host's own ssh, "
                    "which reads that host's ~/.ssh/config; ssh_config names a file of this "
                    "machine",
                )
            )
        dst_entry = hosts.get(h2)
        if (
            route == "direct"
            and not isinstance(direct, dict)
            and isinstance(dst_entry, dict)
            and dst_entry.get("ssh_config")
        ):
            problems.append(
                source.problem(
                    ("transfer", "route"),
                    f"direct: {h1} reaches {h2} with its own ssh, which does "
                    f"not read hosts.{h2}.ssh_config (a file of this machine): say how {h1} "
                    "reaches "
                    f"it (transfer.direct: {{ssh: ..., port: ...}}), or use relay (or auto, which "
                    "falls back to relay when the direct hop fails)",
                )
            )
    problems.extend(_relative_ssh_configs(source, hosts))
    problems.extend(gpu_rules.problems(source, data))
    problems.extend(_checks(source, data))
    return problems


def _relative_ssh_configs(source: Source, hosts: dict) -> list[Problem]:
    """A relative `ssh_config:` names a file from the folder of the spec file that writes it (its
    links resolved): one whose `..` climb above `/`, or that lands in /dev, /proc or /sys, is
    refused as an absolute path there would be (the path's own form: sshopts.config_problem)."""
    out = []
    for hid, entry in hosts.items():
        value = entry.get("ssh_config") if isinstance(entry, dict) else None
        if (
            not isinstance(value, str)
            or value.startswith(("/", "~/"))
            or "%" in value
            or sshopts.config_problem(value)
        ):
            continue
        loc = ("hosts", hid, "ssh_config")
        spec_file = source.origin(loc)
        folder = posixpath.dirname(os.path.realpath(spec_file))
        target = sshopts.config_from(folder, value)
        if target is None:
            out.append(
                source.problem(
                    loc,
                    f"{value} climbs above / from {folder} (the folder of "
                    f"{spec_file}): {sshopts.RELATIVE}",
                )
            )
            continue
        why = sshopts.config_in_system(target)  # the folder's own name may hold any character
        if why:
            out.append(source.problem(loc, f"{value} is {target} from {folder}: {why}"))
    return out


def _is_local(hosts: dict, name: str) -> bool:
    entry = hosts.get(name)
    return isinstance(entry, dict) and entry.get("local") is True


def _norm(path: str) -> str:
    return posixpath.normpath(path) if path else path


def _checks(source: Source, data: dict[str, Any]) -> list[Problem]:
    out = []
    checks = data.get("checks")
    if not isinstance(checks, list):
        return out
    seen: dict[str, int] = {}
    for index, item in enumerate(checks):
        if not isinstance(item, dict):
            out.append(
                source.problem(
                    ("checks", index), "each check is a mapping like `- matmul: {dtype: bfloat16}`"
                )
            )
            continue
        for key in item:
            if key not in CHECK_TYPES:
                continue
            if key in seen and key not in ("python", "command", "matmul"):
                out.append(
                    source.problem(
                        ("checks", index, key),
                        f"check {key!r} is already listed at checks[{seen[key]}]",
                        key=True,
                    )
                )
            seen.setdefault(key, index)
    return out
