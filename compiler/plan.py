"""Stage 3: every decision about what the runbook does, as the view model for the templates: a
`view.Plan`, frozen dataclasses grouped the way the runbook reads (its identity, the kit, the
transfer, the destination, the checks, the fan-out, the hosts, the steps) and the settings block's
rows made from those groups.

Templates only paste values; everything conditional is decided here. Values that go to bash are
plain strings here and get quoted by the render filters; the few words that must expand at run time
(`~/` in an identity path) are built here as `Safe` words.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any, Optional

from . import __version__, catalog, fanout, implied, kit as kitfiles, steps as stepdocs
from .loader import Source
from .render import Safe
from .spec import Host, Spec, failed_checks_policy
from .view import (Array, Checks, Destination, Exclusion, Fanout, HostView, Identity, Kit, KitFile,
                   Map, Plan, Setting, StepView, Transfer)

KIT_DIR = ".kit"  # beside the runbook: generated/.kit/<sha256>.tar
# ShellCheck checks a runbook turns off for the whole file, each with its reason (printed above the
# directive): a reviewer's plain `shellcheck generated/*.sh` agrees with compile's lint.
EXCLUSIONS = (
    Exclusion("SC2016", (
        "scripts run by `sh -c` on a host (here or over ssh) are single-quoted on purpose, so",
        "that `$1` in them expands there; their arguments travel quoted by rb::shq.")),
    Exclusion("SC1003", (
        "spec values are single-quoted by the compiler (Python's shlex.quote), right by",
        "construction; a value may hold a backslash, which this check takes for a mistyped",
        "escape.")),
)
# The default form reads its runtime from the pinned kit, so settings and state variables only
# the runtime reads look unused here. compile lints the runbook with the runtime in place
# (`lint_view`), where this check runs.
PINNED_EXCLUSIONS = EXCLUSIONS + (
    Exclusion("SC2034", (
        "settings and state variables that only the runtime reads (runtime.sh of the pinned",
        "kit) look unused in this file; compile lints the runbook with the runtime in place,",
        "where this check runs.")),
)
SSH_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"

def ssh_words(host: Host, *, here: bool = True) -> list[str]:
    """The ssh arguments that reach `host` (without the runbook's common options). `here`: the
    words run on this machine, so `~/` expands to this machine's $HOME; else ssh expands it."""
    if host.local:
        return []
    words: list[str] = [
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
    if host.ssh_config:
        words += ["-F", identity_word(host.ssh_config) if here else host.ssh_config]
    for key in sorted(host.options):
        words += ["-o", f"{key}={host.options[key]}"]
    return words


def direct_words(spec: Spec) -> list[str]:
    """ssh arguments for the source -> destination hop (run on the source host, so `~/` stays for
    its ssh to expand there)."""
    if spec.transfer.route == "relay":
        return []
    dst = spec.hosts[spec.transfer.target[0]]
    hop = spec.transfer.direct or Host(ssh=dst.ssh, port=dst.port, host_keys=dst.host_keys,
                                       connect_timeout=dst.connect_timeout)
    assert hop.ssh is not None  # validate.py: direct and auto need both ends reached over ssh
    return ssh_words(hop, here=False) + ["--", hop.ssh]


def identity_word(path: str) -> str:
    """An identity file's path; `~/...` as a Safe word that bash expands to this machine's $HOME."""
    if path.startswith("~/"):
        return Safe('"${HOME}"/' + shlex.quote(path[2:]))
    return path


def _where(source: Source, loc: tuple[str, ...]) -> str:
    """`file:line` of the spec entry at `loc`: in the file it came from, for an extends chain."""
    path, line, _col = source.locate(loc, key=True)
    return f"{path}:{line}"


def probe_config(spec: Spec, dst_host: str) -> dict[str, Any]:
    """The checks' config document for `rbprobes run` (docs/design.md): JSON, sent as one argv."""
    gpu = None
    if spec.gpu:
        known = catalog.lookup(spec.gpu.model)
        capability = spec.gpu.capability or (known.capability if known else None)
        gpu = {
            "model": spec.gpu.model,
            "count": spec.gpu.count,
            "capability": capability,
            "arch": catalog.arch_of(capability) if capability else None,
            "names": catalog.model_names(spec.gpu.model),
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


def build(spec: Spec, source: Source, script_name: str, *, standalone: bool = False,
          from_runbook: Optional[dict[str, str]] = None) -> Plan:
    """The view model of the runbook for `spec`. `standalone`: the kit is embedded in the runbook;
    by default the runbook pins the kit by its sha256 and reads it from `.kit/<sha256>.tar` beside
    itself (compiler.kit.pinned; the CLI writes that file). `from_runbook`: each spec file's path
    from the runbook's folder, by its name (cli.runbook_names; absent: the name itself)."""
    src_host, src_path = spec.transfer.source
    dst_host, dst_path = spec.transfer.target
    hosts_used = list(dict.fromkeys([src_host, dst_host]))
    step_ids = stepdocs.step_list(spec)
    again = incremental(spec)
    exclude_args: list[str] = []
    for pattern in spec.transfer.exclude:
        exclude_args += ["--exclude", pattern]
    kit_sha = kitfiles.pinned()[0]
    files = kitfiles.files() if standalone else []

    runbook = Identity(
        name=spec.name,
        script_name=script_name,
        spec_path=source.path,
        spec_sha256=source.sha256,
        spec_chain=tuple(source.chain[1:]),
        spec_files=tuple((path, (from_runbook or {}).get(path, path), sha)
                         for path, sha in source.files),
        description_lines=(spec.description,) if spec.description else (),
        compiler_version=__version__,
        seal_placeholder="0" * 64,
    )
    kit = Kit(
        sha256=kit_sha,
        file="" if standalone else f"{KIT_DIR}/{kit_sha}.tar",
        standalone=standalone,
        partial="partials/kit_embedded.sh.j2" if standalone else "partials/kit_pinned.sh.j2",
        runtime_partial=kitfiles.RUNTIME_INLINE if standalone else kitfiles.RUNTIME_PINNED,
        dirs=tuple(sorted({f.path.rsplit("/", 1)[0] for f in files})),
        files=tuple(KitFile(path=f.path, delimiter=kitfiles.delimiter(f.text, f.path),
                            text=Safe(f.text.rstrip("\n"))) for f in files),
    )
    transfer = Transfer(
        where=_where(source, ("transfer",)),
        src_host=src_host,
        src_path=src_path,
        dst_host=dst_host,
        dst_path=dst_path,
        route=None if spec.fanout else spec.transfer.route,
        compression=spec.transfer.compression,
        auto_compression=stepdocs.auto_compression(spec),
        verify=spec.transfer.verify,
        rerun=spec.transfer.rerun,
        jobs=str(spec.transfer.jobs or "auto"),
        incremental=again,
        exclude_args=tuple(exclude_args),
        direct_ssh=None if spec.fanout else tuple(direct_words(spec)),
        ssh_ciphers=SSH_CIPHERS,
    )
    destination = Destination(
        on_existing=spec.transfer.on_existing,
        special_modes=spec.transfer.special_modes,
        outside_links=spec.transfer.outside_links,
        keep_backups=spec.transfer.keep_backups,
        swap_atomic=spec.transfer.swap_atomic,
        shared_parent=spec.transfer.shared_parent,
        cuda_home=spec.cuda.home if spec.cuda else "",
        env_file=spec.cuda.env_file if spec.cuda and spec.cuda.env_file else "",
        library_path_first=tuple(spec.cuda.library_path_first) if spec.cuda else (),
        env=tuple(f"{k}={v}" for k, v in sorted(spec.env.items())),
    )
    checks = Checks(
        gpu_declared=bool(spec.gpu),
        audit_arch=implied.audit_arch(spec),
        audit_args=tuple(implied.audit_args(spec)),
        run="probe" in step_ids or bool(spec.fanout and spec.checks),
        on_failed_checks=failed_checks_policy(spec),
        config=json.dumps(probe_config(spec, dst_host), sort_keys=True, separators=(",", ":")),
    )
    fan = fanout.view(spec) if spec.fanout else None
    hosts = []
    for hid in hosts_used:
        host = spec.hosts[hid]
        hosts.append(HostView(
            id=hid,
            where=_where(source, ("hosts", hid)),
            summary="this machine" if host.local else f"{host.ssh} over ssh",
            ssh_words=tuple(ssh_words(host)),
            target=host.ssh or "",
        ))
    steps = []
    for i, sid in enumerate(step_ids, 1):
        loc = stepdocs.WHERE[sid]
        if loc[0] not in source.data:
            loc = ("transfer",)
        steps.append(StepView(
            id=sid, index=i, total=len(step_ids), where=_where(source, loc),
            doc=stepdocs.DOCS[sid], host=stepdocs.host(sid, src_host, dst_host),
            preview="\n".join(stepdocs.preview(sid, spec, again)),
            template=f"steps/{sid}.sh.j2",
        ))
    return Plan(
        runbook=runbook, kit=kit, transfer=transfer, destination=destination, checks=checks,
        fanout=fan, hosts=tuple(hosts), partials=tuple(fanout.partials(spec)), steps=tuple(steps),
        settings=_settings(runbook, kit, transfer, destination, checks, fan),
        arrays=_arrays(runbook, transfer, destination, checks, fan, hosts_used, step_ids),
        maps=_maps(steps),
        exclusions=EXCLUSIONS if standalone else PINNED_EXCLUSIONS,
        exclusion_codes=",".join(x.code for x in (EXCLUSIONS if standalone else PINNED_EXCLUSIONS)),
    )


def lint_view(view: Plan) -> Plan:
    """The runbook as compile lints it: the runtime in place (as --standalone has it), with none
    of the exclusions that only the pinned form needs."""
    return dataclasses.replace(
        view, kit=dataclasses.replace(view.kit, runtime_partial=kitfiles.RUNTIME_INLINE),
        exclusions=EXCLUSIONS, exclusion_codes=",".join(x.code for x in EXCLUSIONS))


def _settings(runbook: Identity, kit: Kit, transfer: Transfer, destination: Destination,
              checks: Checks, fan: Optional[Fanout]) -> tuple[Setting, ...]:
    """The runbook's `readonly` values, in its order: the one place that names them."""
    t, d, c = transfer, destination, checks
    rows = [
        Setting("RB_NAME", runbook.name, "The runbook and its spec."),
        Setting("RB_SPEC", runbook.spec_path),
        Setting("RB_SPEC_SHA256", runbook.spec_sha256),
        Setting("RB_COMPILER_VERSION", runbook.compiler_version),
        Setting("RB_KIT_SHA256", kit.sha256, "The kit (hostkit/): " + (
            "embedded below (compile --standalone)." if kit.standalone else
            f"{KIT_DIR}/<sha256>.tar beside this runbook, checked against this hash.")),
        Setting("RB_KIT_FILE", kit.file),
        Setting("RB_SSH_CIPHERS", t.ssh_ciphers, "AES-GCM first: the relay is CPU-bound."),
        Setting("RB_SRC_HOST", t.src_host, f"transfer ({t.where})"),
        Setting("RB_SRC_PATH", t.src_path),
        Setting("RB_DST_HOST", t.dst_host),
        Setting("RB_DST_PATH", t.dst_path),
        *([] if t.route is None else [Setting("RB_ROUTE", t.route)]),
        Setting("RB_COMPRESSION", t.compression),
        Setting("RB_VERIFY", t.verify),
        Setting("RB_ON_EXISTING", d.on_existing),
        Setting("RB_RERUN", t.rerun),
        Setting("RB_SPECIAL_MODES", d.special_modes,
                "the threat model's choices (docs/design.md): setuid/setgid/world-write entries, "
                "links that leave the tree, backups kept, a swap that cannot be one rename, a "
                "destination parent other users can write"),
        Setting("RB_OUTSIDE_LINKS", d.outside_links),
        Setting("RB_KEEP_BACKUPS", str(d.keep_backups)),
        Setting("RB_SWAP_ATOMIC", d.swap_atomic),
        Setting("RB_SHARED_PARENT", d.shared_parent),
        Setting("RB_GPU_DECLARED", "1" if c.gpu_declared else "",
                "gpu: declared: the report says whether the checks proved it (a skip is not a "
                "pass)"),
        Setting("RB_AUDIT_ARCH", c.audit_arch,
                "the static checks on the source before anything moves: the kernel audit for this "
                "arch (empty: no gpu:, or gpu.kernel_audit: false), and the references that leave "
                "the venv"),
        Setting("RB_INCREMENTAL", "1" if t.incremental else "0",
                "a re-run that finds changes sends only them (see docs/design.md)"),
        Setting("RB_JOBS", t.jobs, "hashing threads on each host (auto: one per CPU); one stream "
                "per two where the sending end starts the receiving ends (one host, direct)"),
        Setting("RB_CUDA_HOME", d.cuda_home, "cuda"),
        Setting("RB_ENV_FILE", d.env_file),
    ]
    if fan is not None:
        rows += fanout.settings(fan)
    if c.run:
        rows.append(Setting("RB_ON_FAILED_CHECKS", c.on_failed_checks,
                            "on_failed_checks: what a failed check after the swap does"))
        rows.append(Setting("RB_PROBE_CONFIG", c.config,
                            "The checks, as one JSON document for the probe on the target."))
    return tuple(rows)


def _arrays(runbook: Identity, transfer: Transfer, destination: Destination, checks: Checks,
            fan: Optional[Fanout], hosts: list[str], steps: list[str]) -> tuple[Array, ...]:
    """The runbook's `readonly -a` arrays, in its order."""
    rows = [
        Array("RB_AUDIT_ARGS", checks.audit_args,
              "the kernel audit's options from the spec's kernel_audit check"),
        Array("RB_SPEC_FILES", tuple(word for file in runbook.spec_files for word in file),
              "Each file of the spec, three words each: its name, its path from this runbook's "
              "folder, its sha256: a run refuses to start when one changed."),
        Array("RB_HOSTS", tuple(hosts), "Hosts this runbook touches."),
        Array("RB_STEPS", tuple(steps)),
        Array("RB_EXCLUDE_ARGS", transfer.exclude_args, "transfer.exclude"),
        Array("RB_AUTO_COMPRESSION", transfer.auto_compression,
              "compression auto: the first of these every end of the stream has, else none"),
        Array("RB_LIB_FIRST", destination.library_path_first,
              "cuda.library_path_first, relative to the venv's site-packages"),
        Array("RB_ENV", destination.env, "env"),
    ]
    if fan is not None:
        rows += fanout.arrays(fan)
    if transfer.direct_ssh is not None:
        rows.append(Array("RB_DIRECT_SSH", transfer.direct_ssh,
                          "route direct/auto: ssh arguments the source uses to reach the "
                          "destination"))
    return tuple(rows)


def _maps(steps: list[StepView]) -> tuple[Map, ...]:
    """Each step's summary, --dry-run text and host, by its id (`--list`, `--dry-run`, the log)."""
    return (
        Map("RB_STEP_DOC", tuple((s.id, s.doc) for s in steps)),
        Map("RB_STEP_PREVIEW", tuple((s.id, s.preview) for s in steps)),
        Map("RB_STEP_HOST", tuple((s.id, s.host) for s in steps)),
    )


def incremental(spec: Spec) -> bool:
    """Whether a re-run that finds the source or the destination changed sends only what differs:
    it replaces the install (not with `refuse`) and links unchanged files by their digests."""
    return spec.transfer.on_existing != "refuse" and spec.transfer.verify != "none"

