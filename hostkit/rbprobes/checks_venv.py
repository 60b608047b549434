"""L0 checks of the venv as a tree of files: does it still work where it now lives
(`relocation`), and does it reach outside itself (`outside`)?

Both read the tree without following links (os.scandir, lstat) and open regular files only;
`relocation` also starts the venv's python once, bounded in time.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import unquote, urlparse

from rbrules import links
from rbrules.links import PYTHON_NAME

from . import proc, venvfs
from .result import Context, failed, passed, short_list

ACTIVATE = ("activate", "activate.csh", "activate.fish", "activate.nu", "Activate.ps1")
TRAMPOLINE = re.compile(rb"^'''exec' (.*)$")  # pip/distlib/uv's form for long shebangs
# the form that names no path: the interpreter beside the script (what relocation writes for a
# venv path that is too long for a shebang or is not plain path characters)
BESIDE = re.compile(
    rb"""^'\'\'exec' "\$\(dirname -- "\$\(realpath -- "\$0"\)"\)/([A-Za-z0-9._+-]+)" "\$0" "\$@"$"""
)
PYTHON_START_S = 60
SCAN_LIMIT = 256 << 20  # bytes of one bin/ file searched for the old prefix


def _old_pattern(old: str):
    """The old prefix as a whole path: followed by '/', a quote, whitespace, ':', NUL or the
    end (so /opt/venv does not match /opt/venv2)."""
    return re.compile(re.escape(old.rstrip("/").encode()) + rb"(?=[/\"'\s:;\x00]|$)", re.MULTILINE)


def _inside_venv(path: str, venv: str) -> bool:
    roots = [os.path.normpath(venv), os.path.realpath(venv)]
    if venvfs.inside(os.path.normpath(path), roots):
        return True
    parent = os.path.realpath(os.path.dirname(path))  # /venv-link/bin/python
    return venvfs.inside(os.path.join(parent, os.path.basename(path)), roots)


def parse_interpreter(head: bytes) -> Optional[Tuple[str, List[str], str]]:
    """(interpreter, arguments, form) of a script's first lines, or None without a shebang.
    form: "shebang" or "trampoline" (`#!/bin/sh` + `'''exec' "/venv/bin/python" "$0" "$@"`)."""
    if not head.startswith(b"#!"):
        return None
    lines = head.split(b"\n", 2)
    first = lines[0][2:].strip().decode("utf-8", "replace")
    if first in ("/bin/sh", "/bin/sh -") and len(lines) > 1:
        match = TRAMPOLINE.match(lines[1].rstrip(b"\r"))
        if match:
            try:
                words = shlex.split(match.group(1).decode("utf-8", "replace"))
            except ValueError:
                words = match.group(1).decode("utf-8", "replace").split()
            beside = BESIDE.match(lines[1].rstrip(b"\r"))
            if beside:  # pip's form: the interpreter beside the script, wherever it lives
                return "@beside/" + beside.group(1).decode(), [], "trampoline"
            if words:
                return words[0], words[1:], "trampoline"
    try:
        words = shlex.split(first)
    except ValueError:
        words = first.split()
    if not words:
        return "", [], "shebang"
    return words[0], words[1:], "shebang"


def _env_command(args: List[str]) -> Optional[str]:
    """The program `/usr/bin/env [-S] [-i] [VAR=x]... PROG` runs."""
    words: List[str] = []
    for arg in args:
        words.extend(arg.split() if " " in arg else [arg])
    for word in words:
        if word.startswith("-") or "=" in word:
            continue
        return word
    return None


def _judge_interpreter(
    script: str, head: bytes, venv: str, path_env: str
) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(what the script runs, problem or None)."""
    parsed = parse_interpreter(head)
    if parsed is None:
        return None, None
    interp, args, form = parsed
    info: Dict[str, Any] = {"script": script, "interpreter": interp, "form": form}
    if not interp:
        return info, "%s: empty shebang" % script
    runs = interp
    if interp.startswith("@beside/"):
        where = script if os.path.isabs(script) else os.path.join(venv, script)
        runs = interp = os.path.join(
            os.path.dirname(os.path.realpath(where)), interp[len("@beside/") :]
        )
        info["interpreter"] = interp
    if os.path.basename(interp) == "env" and form == "shebang":
        prog = _env_command(args)
        if not prog:
            return info, "%s: %s without a program" % (script, interp)
        if "/" in prog:
            runs = prog
        else:
            import shutil

            found = shutil.which(prog, path=path_env)
            info["via_env"] = prog
            if not found:
                return info, "%s: `%s %s` finds no %s on PATH (venv bin/ first)" % (
                    script,
                    interp,
                    prog,
                    prog,
                )
            runs = found
    info["runs"] = runs
    if not os.path.isabs(runs):
        return info, "%s: interpreter %s is not an absolute path" % (script, runs)
    if not os.path.exists(runs):
        return info, "%s: interpreter %s does not exist" % (script, runs)
    if not os.access(runs, os.X_OK) or os.path.isdir(runs):
        return info, "%s: interpreter %s is not executable" % (script, runs)
    inside = _inside_venv(runs, venv)
    info["inside"] = inside
    if PYTHON_NAME.match(os.path.basename(runs)) and not inside:
        return info, "%s: runs %s, a python outside the venv" % (script, runs)
    return info, None


def relocation(
    venv: str, old: Optional[str] = None, timeout_s: float = PYTHON_START_S
) -> Dict[str, Any]:
    """Facts about a (moved) venv: what each bin/ script runs, which files still name `old`,
    whether bin/python starts (and with which sys.prefix), whether pyvenv.cfg's home exists.
    `problems` lists what is wrong."""
    venv = os.path.abspath(venv)
    problems: List[Dict[str, str]] = []
    values: Dict[str, Any] = {
        "venv": venv,
        "old": old,
        "scripts": [],
        "names_old": [],
        "activate": [],
        "system_interpreters": [],
    }
    if old and os.path.normpath(old) in (os.path.normpath(venv), os.path.realpath(venv)):
        problems.append(
            {
                "file": "",
                "what": "the old prefix %s is the venv's own path: nothing to compare" % old,
            }
        )
        old = None
    bindir = os.path.join(venv, "bin")
    pattern = _old_pattern(old) if old else None
    path_env = bindir + os.pathsep + os.environ.get("PATH", os.defpath)
    if not os.path.isdir(bindir):
        problems.append({"file": "bin", "what": "no bin/ directory in %s" % venv})
    else:
        with os.scandir(bindir) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = "bin/" + entry.name
            if entry.is_symlink():
                target = os.readlink(entry.path)
                if pattern and pattern.search(target.encode("utf-8", "surrogateescape")):
                    values["names_old"].append(rel)
                    problems.append(
                        {"file": rel, "what": "links to %s, under the old prefix" % target}
                    )
                elif not os.path.exists(entry.path):
                    problems.append(
                        {"file": rel, "what": "links to %s, which does not exist" % target}
                    )
                continue
            if not venvfs.is_regular(entry):
                continue
            data = venvfs.read_small(entry.path, SCAN_LIMIT)
            if data is None:
                problems.append({"file": rel, "what": "cannot be read"})
                continue
            if entry.name in ACTIVATE:
                values["activate"].append(entry.name)
            if pattern and pattern.search(data):
                values["names_old"].append(rel)
                problems.append({"file": rel, "what": "names the old prefix %s" % old})
            info, problem = _judge_interpreter(rel, data[:4096], venv, path_env)
            if info:
                values["scripts"].append(info)
                if info.get("inside") is False and info.get("runs"):
                    values["system_interpreters"].append("%s: %s" % (rel, info["runs"]))
            if problem:
                problems.append({"file": rel, "what": problem.split(": ", 1)[1]})
    cfg = venvfs.pyvenv_cfg(venv)
    if cfg is None:
        values["pyvenv_cfg"] = None
    else:
        home = cfg.get("home")
        values["pyvenv_cfg"] = {"home": home, "home_exists": bool(home and os.path.isdir(home))}
        if not home:
            problems.append({"file": "pyvenv.cfg", "what": "has no home"})
        elif not os.path.isdir(home):
            problems.append({"file": "pyvenv.cfg", "what": "home %s does not exist" % home})
        if pattern:
            data = venvfs.read_small(os.path.join(venv, "pyvenv.cfg"), 1 << 16) or b""
            if pattern.search(data):
                values["names_old"].append("pyvenv.cfg")
                problems.append({"file": "pyvenv.cfg", "what": "names the old prefix %s" % old})
    values["python"] = _start_python(venv, timeout_s, problems)
    values["problems"] = problems
    return values


def _start_python(venv: str, timeout_s: float, problems: List[Dict[str, str]]) -> Dict[str, Any]:
    """Run bin/python -c (bounded): it must start, and its sys.prefix must be the venv."""
    exe = next(
        (
            os.path.join(venv, "bin", n)
            for n in ("python", "python3")
            if os.path.lexists(os.path.join(venv, "bin", n))
        ),
        None,
    )
    if exe is None:
        problems.append({"file": "bin/python", "what": "missing"})
        return {"path": None}
    info: Dict[str, Any] = {"path": exe, "resolves_to": os.path.realpath(exe)}
    code = "import sys; print(sys.prefix); print(sys.version.split()[0])"
    env = proc.child_env()
    env.pop("PYTHONHOME", None)
    env.pop("VIRTUAL_ENV", None)
    try:
        done = proc.run_bounded([exe, "-I", "-c", code], timeout_s, env=env)
    except OSError as exc:
        problems.append({"file": "bin/python", "what": "cannot be started: %s" % exc})
        info["error"] = str(exc)
        return info
    info["seconds"] = round(done.duration_s, 3)
    if done.timed_out:
        problems.append(
            {"file": "bin/python", "what": "did not finish `-c` within %gs" % timeout_s}
        )
        return info
    if done.returncode != 0:
        problems.append(
            {
                "file": "bin/python",
                "what": "-c exited %d: %s" % (done.returncode, done.output.strip()[-200:]),
            }
        )
        return info
    lines = done.stdout.strip().splitlines()
    info["prefix"] = lines[0] if lines else None
    info["version"] = lines[1] if len(lines) > 1 else None
    if info["prefix"] and not _same_dir(info["prefix"], venv):
        problems.append(
            {
                "file": "bin/python",
                "what": "starts with sys.prefix %s, not the venv "
                "%s (pyvenv.cfg missing or wrong?)" % (info["prefix"], venv),
            }
        )
    return info


def _same_dir(one: str, other: str) -> bool:
    return os.path.normpath(one) == os.path.normpath(other) or os.path.realpath(
        one
    ) == os.path.realpath(other)


def relocation_check(params: Dict[str, Any], ctx: Context):
    """Check: the venv works where it lives (see `relocation`)."""
    venv = ctx.venv_or_prefix()
    if not os.path.isdir(venv):
        return failed("venv %s does not exist" % venv)
    values = relocation(venv, params.get("old"), params.get("timeout_s", PYTHON_START_S))
    if values["problems"]:
        text = [
            "%s %s" % (p["file"], p["what"]) if p["file"] else p["what"] for p in values["problems"]
        ]
        return failed("%d problem(s) in %s: %s" % (len(text), venv, short_list(text, 4)), values)
    interps = sorted({s["runs"] for s in values["scripts"] if s.get("runs")})
    py = values["python"]
    text = (
        "%d scripts in bin/ (interpreters: %s); bin/python -> %s starts (Python %s, "
        "sys.prefix is the venv)"
        % (
            len(values["scripts"]),
            short_list(interps, 3) or "none",
            py.get("resolves_to"),
            py.get("version"),
        )
    )
    if values["old"]:
        text += "; no file in bin/ names %s" % values["old"]
    else:
        text += "; old prefix not given: not searched"
    if values["pyvenv_cfg"]:
        text += "; home %s exists" % values["pyvenv_cfg"]["home"]
    else:
        text += "; no pyvenv.cfg (not a venv: home not checked)"
    return passed(text, values)


# ---------------------------------------------------------------------------------------------
# outside: references that leave the tree

FIXES = {
    "editable": "reinstall it without -e (pip install --no-deps --force-reinstall SRC), or "
    "bring SRC to the same path on the destination",
    "pth": "install that directory as a package, or move it into the venv and drop the line",
    "symlink": "replace the link with a copy of what it points to (cp -L), or make that path "
    "exist on the destination",
    "system_site_packages": "recreate the venv without --system-site-packages, or install the "
    "same packages system-wide on the destination",
}


def _ref(
    kind: str,
    where: str,
    target: str,
    package: Optional[str] = None,
    fix: Optional[str] = None,
    **extra,
) -> Dict[str, Any]:
    out = {
        "kind": kind,
        "file": where,
        "target": target,
        "package": package,
        "fix": fix or FIXES[kind.split(":")[0]],
    }
    out.update(extra)
    return out


def _finder_mapping(data: bytes) -> Dict[str, List[str]]:
    """{name: [paths]} from a setuptools `__editable___*_finder.py` (MAPPING, NAMESPACES)."""
    out: Dict[str, List[str]] = {}
    try:
        tree = ast.parse(data.decode("utf-8", "replace"))
    except SyntaxError:
        return out
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
            value = node.value
        if not set(targets) & {"MAPPING", "NAMESPACES"} or value is None:
            continue
        try:
            literal = ast.literal_eval(value)
        except ValueError:
            continue
        if isinstance(literal, dict):
            for module_name, where in literal.items():
                paths = (
                    [where]
                    if isinstance(where, str)
                    else [p for p in where if isinstance(p, str)]
                    if isinstance(where, (list, tuple))
                    else []
                )
                out.setdefault(str(module_name), []).extend(paths)
    return out


def _editable_name(filename: str) -> str:
    """__editable___mypkg_1_0_finder.py -> mypkg 1.0 (as setuptools names it)."""
    stem = re.sub(r"^__editable__[._]*", "", filename)
    stem = re.sub(r"(_finder)?\.(py|pth)$", "", stem)
    match = re.match(r"^(.*?)_(\d+(?:_\d+)*.*)$", stem)
    return "%s %s" % (match.group(1), match.group(2).replace("_", ".")) if match else stem


def outside_refs(venv: str) -> List[Dict[str, Any]]:
    """Every reference from the venv to a path outside it: editable installs (finder mappings,
    __editable__ .pth files, direct_url.json with dir_info.editable), other .pth lines with
    paths outside, symbolic links leaving the tree, include-system-site-packages. The venv's
    own interpreter links (bin/python* into pyvenv.cfg's home) are not listed: they leave the
    tree by design and `relocation` checks them."""
    venv = os.path.abspath(venv)
    roots = [os.path.normpath(venv), os.path.realpath(venv)]
    refs: List[Dict[str, Any]] = []

    def outside(path: str) -> bool:
        return not venvfs.inside(os.path.normpath(path), roots) and not venvfs.inside(
            os.path.realpath(path), roots
        )

    cfg = venvfs.pyvenv_cfg(venv) or {}
    home = cfg.get("home")
    if cfg.get("include-system-site-packages", "false").lower() == "true":
        refs.append(_ref("system_site_packages", "pyvenv.cfg", home or "?"))
    for site in venvfs.site_packages(venv):
        try:
            with os.scandir(site) as it:
                names = sorted(e.name for e in it if not e.is_symlink())  # links: below
        except OSError:
            continue
        for name in names:
            full = os.path.join(site, name)
            rel = os.path.relpath(full, venv)
            if name.startswith("__editable__") and name.endswith("finder.py"):
                data = venvfs.read_small(full) or b""
                for mod, paths in sorted(_finder_mapping(data).items()):
                    for mapped in paths:
                        if outside(mapped):
                            refs.append(
                                _ref("editable", rel, mapped, _editable_name(name), module=mod)
                            )
            elif name.endswith(".pth"):
                data = venvfs.read_small(full) or b""
                editable = name.startswith("__editable__")
                for line in data.decode("utf-8", "replace").splitlines():
                    line = line.strip()
                    if not line or line.startswith(("#", "import ", "import\t")):
                        continue
                    target = line if os.path.isabs(line) else os.path.join(site, line)
                    if outside(target):
                        refs.append(
                            _ref(
                                "editable" if editable else "pth",
                                rel,
                                os.path.normpath(target),
                                _editable_name(name) if editable else None,
                            )
                        )
            elif name.endswith(".dist-info"):
                data = venvfs.read_small(os.path.join(full, "direct_url.json"), 1 << 20)
                if not data:
                    continue
                try:
                    doc = json.loads(data.decode("utf-8", "replace"))
                except ValueError:
                    continue
                url = doc.get("url", "") if isinstance(doc, dict) else ""
                editable = (
                    isinstance(doc, dict)
                    and isinstance(doc.get("dir_info"), dict)
                    and doc["dir_info"].get("editable") is True
                )
                if editable and url.startswith("file://"):
                    target = unquote(urlparse(url).path)
                    if outside(target):
                        stem = name[: -len(".dist-info")]
                        refs.append(
                            _ref(
                                "editable",
                                os.path.join(rel, "direct_url.json"),
                                target,
                                " ".join(stem.split("-", 1)),
                            )
                        )
    interp_dirs = [d for d in (home,) if d]
    lookup = venvfs.link_lookup(venv)
    for top, entry in venvfs.walk(venv):
        if not entry.is_symlink():
            continue
        rel = os.path.relpath(entry.path, venv)
        try:
            text = os.readlink(entry.path)
        except OSError:
            continue
        if not links.leaves(rel, text, lookup, roots):
            continue
        target = os.path.normpath(os.path.join(top, text))
        if not outside(target):  # through a link (`x -> dot/..`): the lexical path lies
            target = os.path.realpath(entry.path)
        if links.interpreter_link(rel) and (
            any(
                venvfs.inside(os.path.realpath(target), [os.path.realpath(d)])
                or venvfs.inside(target, [d])
                for d in interp_dirs
            )
            or not interp_dirs
        ):
            continue  # the venv's interpreter: relocation checks it
        refs.append(
            _ref("symlink", rel, target, venvfs.owner(entry.path), exists=os.path.exists(target))
        )
    # An editable seen through its finder, .pth and direct_url.json stays listed once per
    # file (each is a file to change); the same target twice in one file is listed once.
    seen = set()
    unique = []
    for ref in refs:
        key = (ref["kind"], ref["file"], ref["target"])
        if key not in seen:
            seen.add(key)
            unique.append(ref)
    return unique


def outside_check(params: Dict[str, Any], ctx: Context):
    """Check: nothing in the venv points outside it (see `outside_refs`)."""
    venv = ctx.venv_or_prefix()
    if not os.path.isdir(venv):
        return failed("venv %s does not exist" % venv)
    refs = outside_refs(venv)
    values = {
        "venv": venv,
        "refs": refs,
        "targets": sorted({r["target"] for r in refs}),
        "packages": sorted({r["package"] for r in refs if r.get("package")}),
    }
    if refs:
        described = [
            "%s %s -> %s" % (r["kind"], r["package"] or r["file"], r["target"]) for r in refs
        ]
        kinds = sorted({r["kind"] for r in refs})
        return failed(
            "%d reference(s) leave %s: %s; fix: %s"
            % (
                len(refs),
                venv,
                short_list(described, 4),
                " | ".join("%s: %s" % (k, FIXES[k]) for k in kinds),
            ),
            values,
        )
    return passed(
        "nothing in %s points outside it (editable installs, .pth paths, "
        "symbolic links, system site-packages)" % venv,
        values,
    )
