"""Stage 4: view model -> bash text. Jinja2 with no logic of ours in templates.

Every value that reaches the output must be marked by one of the filters below; `finalize` refuses
anything else, so a template that forgets to quote a value fails to render instead of producing a
script where a spec string could execute.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shlex
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import jinja2
from rbrules import compression, enginerules, launch, linkrate

from .errors import RenderError

if TYPE_CHECKING:
    from .view import Plan

# The repository's templates/ (compiler/templates links to it; a wheel carries the files there).
TEMPLATES = Path(str(resources.files("compiler") / "templates"))
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class Safe(str):
    """Text that is safe to paste into the script where the filter that made it was used."""


def _defined(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises UndefinedError, naming the missing value
    return value


def sh(value: Any) -> Safe:
    """One shell word, single-quoted as needed (POSIX quoting; newlines stay inside the quotes)."""
    value = _defined(value)
    if isinstance(value, Safe):
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RenderError(f"|sh takes a string or an int, got {type(value).__name__}: {value!r}")
    text = str(value)
    if "\0" in text:
        raise RenderError("|sh: NUL cannot be passed to bash")
    return Safe(shlex.quote(text))


def shwords(values: Iterable[Any]) -> Safe:
    """Several shell words for an array body: each quoted by |sh (or already Safe). A word that
    starts with `=` or holds a comma is single-quoted even though bash would read it bare: in an
    array body ShellCheck takes those for index assignments (SC2191) or separators (SC2054)."""
    words = []
    for value in values:
        word = sh(value)
        if (
            not isinstance(value, Safe)
            and (word.startswith("=") or "," in word)
            and word[:1] != "'"
        ):
            word = Safe("'" + word + "'")
        words.append(word)
    return Safe(" ".join(words))


def ident(value: Any) -> Safe:
    text = str(_defined(value))
    if not IDENTIFIER.match(text):
        raise RenderError(f"|ident: {text!r} is not an identifier")
    return Safe(text)


def num(value: Any) -> Safe:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RenderError(f"|num: {value!r} is not an int")
    return Safe(str(value))


def comment(value: Any) -> Safe:
    """Text for a `#` comment: one line, no control characters."""
    text = str(_defined(value))
    if CONTROL.search(text):
        raise RenderError(f"|comment: {text!r} is not one line of text")
    return Safe(text)


def body(value: Any) -> Safe:
    """Author-written text from this repository (kit files inside quoted heredocs)."""
    if not isinstance(value, Safe):
        raise RenderError("|body takes only text the plan marked as ours (Safe)")
    return value


def _finalize(value: Any) -> Any:
    if isinstance(value, Safe):
        return value
    raise RenderError(
        f"unquoted value {value!r} in a template: pass it through |sh, |ident, |num, |comment"
        " or |body"
    )


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates, kept beside the lint cache (keyed by each template's source: jinja2
    checks it), so a whole `compile` does not re-compile 30 templates every time."""
    from .lint import cache_dir  # one cache folder for the compiler, only this user's

    directory = cache_dir("jinja")
    return None if directory is None else jinja2.FileSystemBytecodeCache(str(directory))


@lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    """The one environment of the process: its templates are loaded once for every render (the
    runbook, the lint's runtime-in-place form, the kit's runtime.sh, each spec of a directory)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        bytecode_cache=_bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_finalize,
        # bash's ${#array[@]} would open a jinja comment: comments use <%# ... #%> instead.
        comment_start_string="<%#",
        comment_end_string="#%>",
    )
    env.filters.update(sh=sh, shwords=shwords, ident=ident, num=num, comment=comment, body=body)
    # the rules the runbook's bash shares with the kit (rbrules: the one host-side package the
    # compiler imports): how every Python on a host is started
    env.globals["py"] = {
        "flags": launch.FLAGS,
        "site_flags": launch.SITE_FLAGS,
        "start": launch.START,
    }
    # and which compressors a host has, how long compression auto measures the link, how long a
    # second run waits for the lock
    env.globals["rules"] = {
        "compressor_tools": compression.COMPRESSOR_TOOLS,
        "link_seconds": linkrate.LINK_SECONDS,
        "link_send_seconds": linkrate.LINK_SEND_SECONDS,
        "lock_wait": enginerules.LOCK_WAIT_S,
    }
    return env


HEREDOC = re.compile(r"<<'([A-Za-z_][A-Za-z0-9_]*)'\s*$")


def tidy(text: str) -> str:
    """Strip trailing spaces and squeeze runs of blank lines, except inside quoted heredocs, whose
    text is kept byte for byte."""
    out: list[str] = []
    delimiter = None
    for line in text.split("\n"):
        if delimiter is not None:
            out.append(line)
            if line == delimiter:
                delimiter = None
            continue
        line = line.rstrip()
        if line == "" and out and out[-1] == "":
            continue
        out.append(line)
        match = HEREDOC.search(line)
        if match:
            delimiter = match.group(1)
    return "\n".join(out).rstrip("\n") + "\n"


SEAL = re.compile(r"^(# sha256 of this file with these 64 digits zeroed: )(0{64})$", re.M)


def seal(text: str) -> str:
    """Fill in the runbook's own hash: the sha256 of its text with the 64 digits zeroed (the
    runbook checks it at start and refuses to run when it was edited by hand)."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return SEAL.sub(lambda m: m.group(1) + digest, text, count=1)


def render(view: Plan, template: str = "runbook.sh.j2") -> str:
    """`view`: the plan (resolve.resolve); each of its fields is a name the templates read."""
    names = {f.name: getattr(view, f.name) for f in dataclasses.fields(view)}
    try:
        return seal(tidy(environment().get_template(template).render(names)))
    except jinja2.UndefinedError as exc:
        raise RenderError(f"template {template}: {exc}") from None
