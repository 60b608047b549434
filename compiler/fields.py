"""The spec's field types: one-line checks of single values (names, paths, versions, text without
secrets), the base of every model, and `At` for errors that belong below the value checked.
Anything that will reach a shell is checked here first (compiler/spec.py's docstring says why)."""

# No `from __future__ import annotations` here: pydantic would then eval() every field's
# annotation string when it builds the models at import (~2 ms of each compile).
import posixpath
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

IDENT = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
VERSION = re.compile(r"^[0-9]+(\.[0-9]+){0,3}([a-z0-9.+-]*)$")
CAPABILITY = re.compile(r"^[0-9]{1,2}\.[0-9]$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# what `compile --new` writes where a spec needs a value of its own (`<source host: CHANGE ME>`):
# no address, path or version looks like it, and compile refuses a spec that still holds one
PLACEHOLDER = re.compile(r"<[^<>\n]*CHANGE ME>")


class At(ValueError):
    """A validator's error that belongs to an entry below the value it checks: `at` is the path
    from that value (`("success",)` from a check of the whole `fanout:`), so validate.py points the
    message at that entry (at its key with `key=True`). Several: `At.many([(at, message, key)])`."""

    def __init__(self, at: tuple, message: str, key: bool = False):
        super().__init__(message)
        self.errors: list[tuple[tuple, str, bool]] = [(tuple(at), message, key)]

    @classmethod
    def many(cls, errors: list[tuple[tuple, str, bool]]) -> "At":
        first = cls(*errors[0])
        first.errors = [(tuple(at), message, key) for at, message, key in errors]
        return first


def _empty_list() -> list:
    return []


def _empty_dict() -> dict:
    return {}


# Field(default_factory=_empty_list), not default_factory=list: pydantic inspects the factory's
# signature, and a builtin's is parsed from text with the tokenizer (~2 ms of each compile).


class Model(BaseModel):
    # defer_build: a model's validator is built when it is first used, not at import. A compile
    # validates with Spec's alone (which holds every model's schema), so the 18 per-model
    # validators and serializers are never built.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)


SECRET = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----|PuTTY-User-Key-File|\bsshpass\b")


def _no_secret(value: str) -> str:
    if SECRET.search(value):
        raise ValueError(
            "looks like a private key or password: specs are committed and runbooks are reviewed "
            "in PRs, so keep secrets out (use identity_file: with a path, an ssh agent, or ssh "
            "config)"
        )
    return value


def _text(value: str) -> str:
    """One-line free text (descriptions): no control characters."""
    _no_secret(value)
    if CONTROL.search(value.replace("\t", " ")):
        raise ValueError("must be one line of text without control characters")
    return value


def _nonempty(value: str) -> str:
    _no_secret(value)
    if not value.strip():
        raise ValueError("must not be empty")
    if CONTROL.search(value):
        raise ValueError("must not contain control characters (newline, tab, NUL, ...)")
    return value


def _abs_path(value: str) -> str:
    _nonempty(value)
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path (starting with /), got {value!r}")
    return _clean_path(value)


def _path(value: str) -> str:
    """An absolute path, or a relative one (only where the spec allows it)."""
    _nonempty(value)
    return _clean_path(value)


def _clean_path(value: str) -> str:
    parts = value.split("/")
    if ".." in parts:
        raise ValueError("must not contain '..' components")
    if value.startswith("-"):
        raise ValueError("must not start with '-'")
    norm = posixpath.normpath(value)
    if norm in ("/", "."):
        raise ValueError("must name a directory below / (not / itself)")
    return norm


def _identity_path(value: str) -> str:
    _nonempty(value)
    if value.startswith("~/"):
        _clean_path(value[2:])
        return "~/" + posixpath.normpath(value[2:])
    if not value.startswith("/"):
        raise ValueError("must be an absolute path or start with ~/")
    return _clean_path(value)


def _exclude(value: str) -> str:
    _nonempty(value)
    if value.startswith("-"):
        raise ValueError("must not start with '-'")
    return value


def _ident(value: str) -> str:
    if not IDENT.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: use lower-case letters, digits and _ (start with a "
            "letter)"
        )
    return value


def _name(value: str) -> str:
    if not NAME.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: lower-case letters, digits, '.', '_', '-' (max 63)"
        )
    return value


def _module(value: str) -> str:
    if not MODULE.match(value):
        raise ValueError(f"{value!r} is not a Python module name")
    return value


def _version(value: str) -> str:
    if not VERSION.match(value):
        raise ValueError(f'{value!r} is not a version like "13.0" or "2.11.0"')
    return value


def _capability(value: str) -> str:
    if not CAPABILITY.match(value):
        raise ValueError(f'{value!r} is not a compute capability like "10.3"')
    return value


Text = Annotated[str, AfterValidator(_text)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
IdentityPath = Annotated[str, AfterValidator(_identity_path)]
Exclude = Annotated[str, AfterValidator(_exclude)]
Ident = Annotated[str, AfterValidator(_ident)]
Name = Annotated[str, AfterValidator(_name)]
ModuleName = Annotated[str, AfterValidator(_module)]
Version = Annotated[str, AfterValidator(_version)]
Capability = Annotated[str, AfterValidator(_capability)]
NonEmpty = Annotated[str, AfterValidator(_nonempty)]
Port = Annotated[int, Field(strict=True, ge=1, le=65535)]


def parse_endpoint(value: str) -> tuple[str, str]:
    """'host:/path' -> (host, path); the host is checked against `hosts:` later."""
    host, sep, path = value.partition(":")
    if not sep or not host:
        raise ValueError(f"{value!r} must be HOST:PATH, e.g. b300:/opt/sglang/.venv")
    return host, path


def _endpoint(value: str) -> str:
    host, path = parse_endpoint(value)
    _ident(host)
    _path(path)
    return value


EndpointText = Annotated[str, AfterValidator(_endpoint)]


def _env_name(value: str) -> str:
    if not ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not an environment variable name")
    return value


def _gpu_model(value: str) -> str:
    # as people write it or nvidia-smi prints it: "B300", "NVIDIA H100 80GB HBM3" (catalog.lookup)
    if not re.match(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]| (?! )){0,79}(?<! )$", value):
        raise ValueError(f'{value!r} is not a GPU model name like B300 or "NVIDIA H100 80GB HBM3"')
    return value


Snippet = Annotated[str, Field(min_length=1, max_length=20000), AfterValidator(_no_secret)]
