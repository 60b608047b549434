"""Stage 3: every decision about what the runbook does, as a flat view model for the templates.

Templates only paste values; everything conditional is decided here. Values that go to bash are
plain strings here and get quoted by the render filters; the few words that must expand at run time
(`~/` in an identity path) are built here as `Safe` words.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from . import __version__, catalog, fanout, implied, kit as kitfiles, steps as stepdocs
from .loader import Source
from .render import Safe
from .spec import Host, Spec, failed_checks_policy

KIT_DIR = ".kit"  # beside the runbook: generated/.kit/<sha256>.tar
# ShellCheck checks a runbook turns off for the whole file, each with its reason (printed above the
# directive): a reviewer's plain `shellcheck generated/*.sh` agrees with compile's lint.
EXCLUSIONS = (
    ("SC2016", ("scripts run by `sh -c` on a host (here or over ssh) are single-quoted on purpose, so",
                "that `$1` in them expands there; their arguments travel quoted by rb::shq.")),
    ("SC1003", ("spec values are single-quoted by the compiler (Python's shlex.quote), right by",
                "construction; a value may hold a backslash, which this check takes for a mistyped",
                "escape.")),
)
# The default form reads its runtime from the pinned kit, so settings and state variables only
# the runtime reads look unused here. compile lints the runbook with the runtime in place
# (`lint_view`), where this check runs.
PINNED_EXCLUSIONS = EXCLUSIONS + (
    ("SC2034", ("settings and state variables that only the runtime reads (runtime.sh of the pinned",
                "kit) look unused in this file; compile lints the runbook with the runtime in place,",
                "where this check runs.")),
)
SSH_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"

def ssh_words(host: Host, *, here: bool = True) -> list[Any]:
    """The ssh arguments that reach `host` (without the runbook's common options). `here`: the
    words run on this machine, so `~/` expands to this machine's $HOME; else ssh expands it."""
    if host.local:
        return []
    words: list[Any] = [
        "-o", f"ConnectTimeout={host.connect_timeout}",
        "-o", f"StrictHostKeyChecking={'yes' if host.host_keys == 'strict' else 'accept-new'}",
    ]
    if host.port:
        words += ["-p", str(host.port)]
    if host.identity_file:
        identity = identity_word(host.identity_file) if here else host.identity_file
        words += ["-o", "IdentitiesOnly=yes", "-i", identity]
    if host.jump:
        words += ["-J", host.jump]
    for key in sorted(host.options):
        words += ["-o", f"{key}={host.options[key]}"]
    return words


def direct_words(spec: Spec) -> list[Any]:
    """ssh arguments for the source -> destination hop (run on the source host, so `~/` stays for
    its ssh to expand there)."""
    if spec.transfer.route == "relay":
        return []
    dst = spec.hosts[spec.transfer.target[0]]
    hop = spec.transfer.direct or Host(ssh=dst.ssh, port=dst.port, host_keys=dst.host_keys,
                                       connect_timeout=dst.connect_timeout)
    return ssh_words(hop, here=False) + ["--", hop.ssh]


def identity_word(path: str) -> Any:
    if path.startswith("~/"):
        return Safe('"${HOME}"/' + shlex.quote(path[2:]))
    return path


def _where(source: Source, loc: tuple) -> str:
    """`file:line` of the spec entry at `loc`: in the file it came from, for an extends chain."""
    path, line, _col = source.locate(loc, key=True)
    return f"{path}:{line}"


def probe_config(spec: Spec, dst_host: str) -> dict:
    gpu = None
    if spec.gpu:
        known = catalog.lookup(spec.gpu.model)
        capability = spec.gpu.capability or (known.capability if known else None)
        gpu = {
            "model": spec.gpu.model,
            "count": spec.gpu.count,
            "capability": capability,
            "arch": catalog.arch_of(capability) if capability else None,
        }
    cuda = None
    if spec.cuda:
        cuda = {"version": spec.cuda.version, "home": spec.cuda.home,
                "library_dirs": [], "library_path_first": list(spec.cuda.library_path_first)}
    checks = []
    for i, check in enumerate(spec.checks):
        kind = check.kind
        ident = kind if sum(c.kind == kind for c in spec.checks) == 1 else f"{kind}_{i}"
        checks.append({"id": ident, "type": kind, "params": check.params,
                       "allow_skip": check.allow_skip})
    checks = implied.implied_checks(spec, checks) + checks
    return {"schema": 1, "host": dst_host, "venv": None, "gpu": gpu, "cuda": cuda,
            "checks": checks}


def build(spec: Spec, source: Source, script_name: str, *, standalone: bool = False) -> dict:
    """The view model of the runbook for `spec`. `standalone`: the kit is embedded in the runbook;
    by default the runbook pins the kit by its sha256 and reads it from `.kit/<sha256>.tar` beside
    itself (compiler.kit.pinned; the CLI writes that file)."""
    src_host, src_path = spec.transfer.source
    dst_host, dst_path = spec.transfer.target
    hosts_used = list(dict.fromkeys([src_host, dst_host]))
    steps = stepdocs.step_list(spec)
    exclude_args: list[str] = []
    for pattern in spec.transfer.exclude:
        exclude_args += ["--exclude", pattern]
    env_pairs = [f"{k}={v}" for k, v in sorted(spec.env.items())]
    config = probe_config(spec, dst_host)
    kit_sha = kitfiles.pinned()[0]

    settings = [
        _s("RB_NAME", spec.name, "The runbook and its spec."),
        _s("RB_SPEC", source.path),
        _s("RB_SPEC_SHA256", source.sha256),
        _s("RB_COMPILER_VERSION", __version__),
        _s("RB_KIT_SHA256", kit_sha, "The kit (hostkit/): " + (
            "embedded below (compile --standalone)." if standalone else
            f"{KIT_DIR}/<sha256>.tar beside this runbook, checked against this hash.")),
        _s("RB_KIT_FILE", "" if standalone else f"{KIT_DIR}/{kit_sha}.tar"),
        _s("RB_SSH_CIPHERS", SSH_CIPHERS, "AES-GCM first: the relay is CPU-bound."),
        _s("RB_SRC_HOST", src_host, f"transfer ({_where(source, ('transfer',))})"),
        _s("RB_SRC_PATH", src_path),
        _s("RB_DST_HOST", dst_host),
        _s("RB_DST_PATH", dst_path),
        *([] if spec.fanout else [_s("RB_ROUTE", spec.transfer.route)]),
        _s("RB_COMPRESSION", spec.transfer.compression),
        _s("RB_VERIFY", spec.transfer.verify),
        _s("RB_ON_EXISTING", spec.transfer.on_existing),
        _s("RB_RERUN", spec.transfer.rerun),
        _s("RB_SPECIAL_MODES", spec.transfer.special_modes,
           "the threat model's choices (docs/design.md): setuid/setgid/world-write entries, links "
           "that leave the tree, backups kept, a swap that cannot be one rename"),
        _s("RB_OUTSIDE_LINKS", spec.transfer.outside_links),
        _s("RB_KEEP_BACKUPS", str(spec.transfer.keep_backups)),
        _s("RB_SWAP_ATOMIC", spec.transfer.swap_atomic),
        _s("RB_GPU_DECLARED", "1" if spec.gpu else "",
           "gpu: declared: the report says whether the checks proved it (a skip is not a pass)"),
        _s("RB_AUDIT_ARCH", implied.audit_arch(spec),
           "the static checks on the source before anything moves: the kernel audit for this arch "
           "(empty: no gpu:, or gpu.kernel_audit: false), and the references that leave the venv"),
        _s("RB_INCREMENTAL", "1" if incremental(spec) else "0",
           "a re-run that finds changes sends only them (see docs/design.md)"),
        _s("RB_JOBS", str(spec.transfer.jobs or "auto"), "hashing threads on each host (auto: one per CPU)"),
        _s("RB_CUDA_HOME", spec.cuda.home if spec.cuda else "", "cuda"),
        _s("RB_ENV_FILE", (spec.cuda.env_file if spec.cuda and spec.cuda.env_file else "")),
    ]
    if spec.fanout:
        settings += fanout.settings(spec)
    if "probe" in steps or (spec.fanout and spec.checks):
        settings.append(_s("RB_ON_FAILED_CHECKS", failed_checks_policy(spec),
                           "on_failed_checks: what a failed check after the swap does"))
        settings.append(_s("RB_PROBE_CONFIG", json.dumps(config, sort_keys=True, separators=(",", ":")),
                           "The checks, as one JSON document for the probe on the target."))
    arrays = [
        {"name": "RB_AUDIT_ARGS", "words": implied.audit_args(spec),
         "comment": "the kernel audit's options from the spec's kernel_audit check"},
        {"name": "RB_SPEC_FILES", "words": [f"{path}={sha}" for path, sha in source.files],
         "comment": "Each file of the spec and its sha256: a run refuses to start when one changed."},
        {"name": "RB_HOSTS", "words": hosts_used, "comment": "Hosts this runbook touches."},
        {"name": "RB_STEPS", "words": steps, "comment": ""},
        {"name": "RB_EXCLUDE_ARGS", "words": exclude_args, "comment": "transfer.exclude"},
        {"name": "RB_LIB_FIRST",
         "words": list(spec.cuda.library_path_first) if spec.cuda else [],
         "comment": "cuda.library_path_first, relative to the venv's site-packages"},
        {"name": "RB_ENV", "words": env_pairs, "comment": "env"},
    ]
    if spec.fanout:
        arrays += fanout.arrays(spec)
    else:
        arrays.append({"name": "RB_DIRECT_SSH", "words": direct_words(spec),
                       "comment": "route direct/auto: ssh arguments the source uses to reach the "
                       "destination"})
    maps = [
        {"name": "RB_STEP_DOC", "entries": [(s, stepdocs.DOCS[s]) for s in steps]},
        {"name": "RB_STEP_PREVIEW",
         "entries": [(s, "\n".join(stepdocs.preview(s, spec, incremental(spec)))) for s in steps]},
        {"name": "RB_STEP_HOST",
         "entries": [(s, stepdocs.host(s, src_host, dst_host)) for s in steps]},
    ]
    hosts = []
    for hid in hosts_used:
        host = spec.hosts[hid]
        hosts.append({
            "id": hid,
            "where": _where(source, ("hosts", hid)),
            "summary": "this machine" if host.local else f"{host.ssh} over ssh",
            "ssh_words": ssh_words(host),
            "target": host.ssh or "",
        })
    files = kitfiles.files() if standalone else []
    kit = [{"path": f.path, "delimiter": kitfiles.delimiter(f.text, f.path),
            "text": Safe(f.text.rstrip("\n"))}
           for f in files]
    step_views = []
    for i, sid in enumerate(steps, 1):
        loc = stepdocs.WHERE[sid]
        if loc[0] not in source.data:
            loc = ("transfer",)
        step_views.append({
            "id": sid, "index": i, "total": len(steps), "where": _where(source, loc),
            "doc_lines": [stepdocs.DOCS[sid]], "template": f"steps/{sid}.sh.j2",
        })
    return {
        "spec_path": source.path,
        "spec_sha256": source.sha256,
        "spec_chain": list(source.chain[1:]),
        "script_name": script_name,
        "description_lines": [spec.description] if spec.description else [],
        "settings": settings,
        "arrays": arrays,
        "maps": maps,
        "hosts": hosts,
        "kit_dirs": sorted({f.path.rsplit("/", 1)[0] for f in files}),
        "kit_files": kit,
        "kit_partial": "partials/kit_embedded.sh.j2" if standalone else "partials/kit_pinned.sh.j2",
        "runtime_partial": kitfiles.RUNTIME_INLINE if standalone else kitfiles.RUNTIME_PINNED,
        **exclusions(EXCLUSIONS if standalone else PINNED_EXCLUSIONS),
        "compiler_version": __version__,
        "seal_placeholder": "0" * 64,
        "steps": step_views,
        "partials": fanout.partials(spec),
    }


def lint_view(view: dict) -> dict:
    """The runbook as compile lints it: the runtime in place (as --standalone has it), with none
    of the exclusions that only the pinned form needs."""
    return dict(view, runtime_partial=kitfiles.RUNTIME_INLINE, **exclusions(EXCLUSIONS))


def exclusions(table: tuple) -> dict:
    return {"exclusions": [{"code": c, "lines": list(lines)} for c, lines in table],
            "exclusion_codes": ",".join(c for c, _ in table)}


def incremental(spec: Spec) -> bool:
    """Whether a re-run that finds the source or the destination changed sends only what differs:
    it replaces the install (not with `refuse`) and links unchanged files by their digests."""
    return spec.transfer.on_existing != "refuse" and spec.transfer.verify != "none"


def _s(name: str, value: str, comment: str = "") -> dict:
    return {"name": name, "value": value, "comment": comment}
