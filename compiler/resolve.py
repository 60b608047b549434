"""Stage 3: `resolve(spec) -> Plan`, every decision about what the runbook does, made once.

The validated spec enters here and nowhere after: this module reads it into the Plan's groups
(the runbook's identity, the kit, the transfer, the destination, the checks, the fan-out, the
hosts), expands the node set once, takes the names beside the destination from rbrules.paths,
derives the GPU's capability once, decides the implied checks once, and picks how the runbook
installs once, as a strategy: `steps.SingleHost` (one destination) or `fanout.FanOut` (the nodes),
each with its own steps, previews, settings rows and partials. Every text after this (the
settings block, `--list`, `--dry-run`, `compile --plan`) is made from the Plan alone (plan.py,
steps.py, fanout.py, planmd.py). The spec leaves this module once: to spec.failed_checks_policy.

Values that go to bash are plain strings here and get quoted by the render filters; the few words
that must expand at run time (`~/` in an identity path) are built here as `Safe` words.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import shlex
from typing import Any, Optional

from rbrules import paths

from . import __version__, actions, catalog, fanout, plan, steps
from . import kit as kitfiles
from .loader import Source
from .render import Safe
from .spec import Host, Spec, failed_checks_policy
from .view import (
    Check,
    Checks,
    Decisions,
    Destination,
    Fanout,
    Gpu,
    HostView,
    Identity,
    Install,
    Kit,
    KitFile,
    Plan,
    StepView,
    Transfer,
)

# AES-GCM first: the relay is CPU-bound
SSH_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"


def resolve(
    spec: Spec,
    source: Source,
    script_name: str,
    *,
    standalone: bool = False,
    from_runbook: Optional[dict[str, str]] = None,
) -> Plan:
    """The Plan of the runbook for `spec`. `standalone`: the kit is embedded in the runbook; by
    default the runbook pins the kit by its sha256 and reads it from `.kit/<sha256>.tar` beside
    itself (compiler.kit.pinned; the CLI writes that file). `from_runbook`: each spec file's path
    from the runbook's folder, by its name (cli.runbook_names; absent: the name itself)."""
    src_host, src_path = spec.transfer.source
    dst_host, dst_path = spec.transfer.target
    # the one place that asks whether this is a fan-out
    install: Install = steps.SingleHost()
    if spec.fanout:
        fan = _fanout(spec)
        install = fanout.FanOut(fan, fanout.ENGINES[fan.engine])
    hosts = tuple(
        _host(spec.hosts[hid], hid, source, from_runbook or {})
        for hid in dict.fromkeys([src_host, dst_host])
    )
    transfer = Transfer(
        where=_where(source, ("transfer",)),
        src_host=src_host,
        src_path=src_path,
        dst_host=dst_host,
        dst_path=dst_path,
        route=spec.transfer.route if install.streams else None,
        route_written=spec.transfer.route,
        compression=spec.transfer.compression,
        auto_compression=install.auto_compression,
        verify=spec.transfer.verify,
        rerun=spec.transfer.rerun,
        jobs=str(spec.transfer.jobs or "auto"),
        incremental=spec.transfer.on_existing != "refuse" and spec.transfer.verify != "none",
        exclude=tuple(spec.transfer.exclude),
        exclude_args=tuple(w for pattern in spec.transfer.exclude for w in ("--exclude", pattern)),
        direct_ssh=tuple(direct_words(spec)) if install.streams else None,
        ssh_ciphers=SSH_CIPHERS,
    )
    cuda = spec.cuda
    env_file = cuda.env_file if cuda and cuda.env_file else ""
    destination = Destination(
        on_existing=spec.transfer.on_existing,
        special_modes=spec.transfer.special_modes,
        outside_links=spec.transfer.outside_links,
        keep_backups=spec.transfer.keep_backups,
        swap_atomic=spec.transfer.swap_atomic,
        shared_parent=spec.transfer.shared_parent,
        cuda_home=cuda.home if cuda else "",
        env_file=env_file,
        env_path=paths.env_file(dst_path, env_file),
        staging=paths.staging(dst_path),
        lock=paths.lock(dst_path),
        cuda_version=cuda.version if cuda else "",
        library_path_first=tuple(cuda.library_path_first) if cuda else (),
        env=tuple(f"{k}={v}" for k, v in sorted(spec.env.items())),
    )
    checks = _checks(spec, dst_host)
    kit_sha = kitfiles.pinned()[0]
    files = kitfiles.files() if standalone else []
    separator = kitfiles.separator([f.text for f in files])
    runbook = Identity(
        name=spec.name,
        script_name=script_name,
        spec_path=source.path,
        spec_sha256=source.sha256,
        spec_chain=tuple(source.chain[1:]),
        spec_files=tuple(
            (path, (from_runbook or {}).get(path, path), sha) for path, sha in source.files
        ),
        description_lines=(spec.description,) if spec.description else (),
        compiler_version=__version__,
        seal_placeholder="0" * 64,
    )
    kit = Kit(
        sha256=kit_sha,
        file="" if standalone else f"{plan.KIT_DIR}/{kit_sha}.tar",
        standalone=standalone,
        partial="partials/kit_embedded.sh.j2" if standalone else "",  # pinned: the runtime's
        runtime_partial=kitfiles.RUNTIME_INLINE if standalone else kitfiles.RUNTIME_PINNED,
        separator=separator,
        delimiter=kitfiles.delimiter("\n".join(f.text for f in files) + "\n" + separator, "kit"),
        host_dirs=kitfiles.HOST_PACKAGES,
        files=tuple(_kit_file(f, separator) for f in files),
    )
    decided = Decisions(
        runbook=runbook,
        kit=kit,
        transfer=transfer,
        destination=destination,
        checks=checks,
        fanout=install.fanout,
        install=install,
        hosts=hosts,
    )
    # the steps (each with its --dry-run preview) and the settings rows, from the decisions; then
    # the Plan in one go
    ids = install.step_ids(checks.run)
    held = actions.named(decided, ids)
    step_views = tuple(
        StepView(
            id=sid,
            index=index,
            total=len(ids),
            where=_step_where(source, sid),
            doc=steps.DOCS[sid],
            host=steps.host(sid, transfer),
            preview="\n".join(actions.preview(install.actions[sid], decided, held)),
            # the single-host bodies are the runtime's (runtime_inline.sh.j2), a fan-out's its
            # own
            template="" if sid in steps.SINGLE_HOST else f"steps/{sid}.sh.j2",
        )
        for index, sid in enumerate(ids, 1)
    )
    settings, arrays, maps = plan.rows(decided, step_views)
    exclusions = plan.EXCLUSIONS if standalone else plan.PINNED_EXCLUSIONS
    return Plan(
        **{field.name: getattr(decided, field.name) for field in dataclasses.fields(decided)},
        partials=install.partials,
        steps=step_views,
        settings=settings,
        arrays=arrays,
        maps=maps,
        exclusions=exclusions,
        exclusion_codes=",".join(x.code for x in exclusions),
    )


def _step_where(source: Source, sid: str) -> str:
    """`file:line` of the spec's field a step is about (the transfer when the spec lacks it)."""
    loc = steps.WHERE[sid]
    if loc[0] not in source.data:
        loc = ("transfer",)
    return _where(source, loc)


# -- hosts -----------------------------------------------------------------------------------------


def _kit_file(file: kitfiles.KitFile, separator: str) -> KitFile:
    """One file of an embedded kit: the line naming it, then its text (kit.embedded)."""
    text, cut = kitfiles.embedded(file.text)
    return KitFile(
        path=file.path,
        head=Safe(f"{separator} {file.path}" + (" -n" if cut else "")),
        text=Safe(text),
    )


def _host(host: Host, hid: str, source: Source, from_runbook: dict[str, str]) -> HostView:
    if host.ssh_config:
        found = ssh_config_path(
            host.ssh_config, source.origin(("hosts", hid, "ssh_config")), from_runbook
        )
        host = host.model_copy(update={"ssh_config": found})
    return HostView(
        id=hid,
        where=_where(source, ("hosts", hid)),
        summary="this machine" if host.local else f"{host.ssh} over ssh",
        ssh_words=tuple(ssh_words(host)),
        target=host.ssh or "",
        local=host.local,
        port=host.port or 0,
        identity_file=host.identity_file or "",
        jump=host.jump or "",
        host_keys=host.host_keys,
        options=tuple((key, host.options[key]) for key in sorted(host.options)),
    )


def ssh_words(host: Host, *, here: bool = True) -> list[str]:
    """The ssh arguments that reach `host` (without the runbook's common options). `here`: the
    words run on this machine, so `~/` expands to this machine's $HOME; else ssh expands it."""
    if host.local:
        return []
    words: list[str] = [
        "-o",
        f"ConnectTimeout={host.connect_timeout}",
        "-o",
        f"StrictHostKeyChecking={'yes' if host.host_keys == 'strict' else 'accept-new'}",
    ]
    if host.port:
        words += ["-p", str(host.port)]
    if host.identity_file:
        identity = identity_word(host.identity_file) if here else host.identity_file
        words += ["-o", "IdentitiesOnly=yes", "-i", identity]
    if host.jump:
        words += ["-J", host.jump]
    if host.ssh_config:
        words += ["-F", ssh_config_word(host.ssh_config) if here else host.ssh_config]
    for key in sorted(host.options):
        words += ["-o", f"{key}={host.options[key]}"]
    return words


def direct_words(spec: Spec) -> list[str]:
    """ssh arguments for the source -> destination hop (run on the source host, so `~/` stays for
    its ssh to expand there)."""
    if spec.transfer.route == "relay":
        return []
    dst = spec.hosts[spec.transfer.target[0]]
    hop = spec.transfer.direct or Host(
        ssh=dst.ssh, port=dst.port, host_keys=dst.host_keys, connect_timeout=dst.connect_timeout
    )
    assert hop.ssh is not None  # validate.py: direct and auto need both ends reached over ssh
    return ssh_words(hop, here=False) + ["--", hop.ssh]


def identity_word(path: str) -> str:
    """An identity file's path; `~/...` as a Safe word that bash expands to this machine's $HOME."""
    if path.startswith("~/"):
        return Safe('"${HOME}"/' + _array_word(path[2:]))
    return path


def _array_word(text: str) -> str:
    """`text` quoted for the tail of a word in an array body: a comma single-quoted even where
    bash reads it bare, as render.shwords does (ShellCheck takes it for a separator, SC2054)."""
    word = shlex.quote(text)
    return f"'{word}'" if "," in word and not word.startswith("'") else word


def ssh_config_path(value: str, spec_file: str, from_runbook: dict[str, str]) -> str:
    """A host's ssh_config as the runbook finds it: an absolute or ~/ path as written; a relative
    one, written from the folder of `spec_file` (the file of the chain that holds it), rewritten
    from the runbook's folder (`ssh/config` in specs/x.yaml: ../specs/ssh/config from generated/),
    so a committed runbook never carries the checkout's place. `from_runbook`: each spec file's
    path from the runbook's folder (cli.runbook_names; a file absent: from its absolute folder,
    for a plan with no runbook). Both paths are made of real folders (realpath) and the value's
    `..` only lead (sshopts), so joining them as text names what the kernel reaches."""
    if value.startswith(("/", "~/")):
        return value
    folder = posixpath.dirname(
        from_runbook[spec_file] if spec_file in from_runbook else os.path.realpath(spec_file)
    )
    return posixpath.normpath(posixpath.join(folder, value))


def ssh_config_word(path: str) -> str:
    """The -F word of `path` (ssh_config_path): `~/` expands to this machine's $HOME; a relative
    path is found from the runbook's own folder (RB_SELF_ABS, absolute), wherever it runs from."""
    if path.startswith(("/", "~/")):
        return identity_word(path)
    return Safe('"${RB_SELF_ABS%/*}"/' + _array_word(path))


def _where(source: Source, loc: tuple[str, ...]) -> str:
    """`file:line` of the spec entry at `loc`: in the file it came from, for an extends chain."""
    path, line, _col = source.locate(loc, key=True)
    return f"{path}:{line}"


# -- the GPU and the checks ------------------------------------------------------------------------


def _gpu(spec: Spec) -> Optional[Gpu]:
    """The declared GPU with its capability, derived once: the spec's, else the catalog's."""
    if not spec.gpu:
        return None
    capability, arch, arch_name, names = catalog.declared(spec.gpu.model, spec.gpu.capability)
    return Gpu(
        model=spec.gpu.model,
        count=spec.gpu.count,
        capability=capability,
        arch=arch,
        arch_name=arch_name,
        names=tuple(names),
    )


def _checks(spec: Spec, dst_host: str) -> Checks:
    gpu = _gpu(spec)
    audit = spec.gpu.kernel_audit if spec.gpu else False
    listed_audit = [c for c in spec.checks if c.kind == "kernel_audit"]
    params = listed_audit[0].params if listed_audit else {}
    arch = ""
    if audit:
        arch = params.get("arch") or (gpu.arch if gpu else "")
    listed = []
    for index, check in enumerate(spec.checks):
        kind = check.kind
        ident = kind if sum(c.kind == kind for c in spec.checks) == 1 else f"{kind}_{index}"
        listed.append(
            {"id": ident, "type": kind, "params": check.params, "allow_skip": check.allow_skip}
        )
    implied = implied_checks(spec.transfer.source[1], audit, {c["type"] for c in listed})
    gpu_doc = (
        None
        if gpu is None
        else {
            "model": gpu.model,
            "count": gpu.count,
            "capability": gpu.capability or None,
            "arch": gpu.arch or None,
            "names": list(gpu.names),
        }
    )
    cuda_doc = (
        None
        if not spec.cuda
        else {
            "version": spec.cuda.version,
            "home": spec.cuda.home,
            "library_dirs": [],
            "library_path_first": list(spec.cuda.library_path_first),
        }
    )
    config = {
        "schema": 1,
        "host": dst_host,
        "venv": None,
        "gpu": gpu_doc,
        "cuda": cuda_doc,
        "checks": implied + listed,
    }
    return Checks(
        gpu_declared=gpu is not None,
        gpu=gpu,
        listed=tuple(
            Check(
                kind=c.kind,
                params=tuple((k, _shown(v)) for k, v in c.params.items()),
                allow_skip=c.allow_skip,
            )
            for c in spec.checks
        ),
        kinds=tuple(c["type"] for c in implied + listed),
        audit_arch=arch,
        audit_args=tuple(audit_args(params)) if listed_audit else (),
        run=bool(spec.checks),
        on_failed_checks=failed_checks_policy(spec),
        config=json.dumps(config, sort_keys=True, separators=(",", ":")),
    )


def implied_checks(src: str, audit: bool, kinds: set[str]) -> list[dict[str, Any]]:
    """The checks every probe runs whatever the spec lists (issue #16): the relocation proof, and
    with `gpu:` the kernel audit of the whole venv for its arch (unless `gpu.kernel_audit: false`,
    or the spec lists its own). They run first: they read files and need no GPU."""
    out: list[dict[str, Any]] = []
    if "relocation" not in kinds:
        params = {"old": src} if src.startswith("/") else {}
        out.append(
            {"id": "relocation", "type": "relocation", "params": params, "allow_skip": False}
        )
    if audit and "kernel_audit" not in kinds:
        out.append(
            {"id": "kernel_audit", "type": "kernel_audit", "params": {}, "allow_skip": False}
        )
    return out


def audit_args(params: dict[str, Any]) -> list[str]:
    """`rbprobes preflight` options from the spec's own kernel_audit check (paths, partial_ok,
    strict): the audit before the move judges as the one after it."""
    words: list[str] = []
    for path in params.get("paths") or []:
        words += ["--path", path]
    if params.get("partial_ok") == []:
        words.append("--no-partial-ok")
    for glob in params.get("partial_ok") or []:
        words += ["--partial-ok", glob]
    if params.get("strict"):
        words.append("--strict")
    return words


def _shown(value: Any) -> str:
    """A check's parameter in one short line (compile --plan's table)."""
    if isinstance(value, list):
        return (
            "[" + ", ".join(str(v) for v in value[:8]) + (", ..." if len(value) > 8 else "") + "]"
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value.splitlines()[0] if isinstance(value, str) and value else value)


# -- the fan-out -----------------------------------------------------------------------------------


def _fanout(spec: Spec) -> Fanout:
    """What the runbook needs of `fanout:`: the nodes, expanded once, and the engine's options."""
    given = spec.fanout
    assert given is not None
    clush = given.engine == "clush"
    nodes = fanout.expand(given.nodes)
    engine_opts: list[str] = []
    if given.ssh_config:
        engine_opts += ["-o", f"-F {given.ssh_config}"]
    if given.width:
        engine_opts += ["-f", str(given.width)]
    if given.topology:
        engine_opts += [f"--topology={given.topology}"]
    # how clush is started: in tree mode with the python the gateways run ClusterShell's gateway
    # with (clush passes CLUSTERSHELL_GW_PYTHON_EXECUTABLE on to them; without it each gateway
    # runs whatever `python3` its PATH finds)
    starts = (
        [
            "env",
            f"CLUSTERSHELL_GW_PYTHON_EXECUTABLE={given.gateway_python or fanout.GATEWAY_PYTHON}",
            "clush",
        ]
        if given.topology
        else ["clush"]
    )
    return Fanout(
        engine=given.engine,
        nodes=fanout.fold(nodes),
        nodes_given=given.nodes,
        node_list=tuple(nodes),
        success=str(given.success),
        timeout_s=given.timeout_s,
        connect_timeout=given.connect_timeout,
        # the start of each node's scratch name; the run adds 16 random hex digits (fan_copy),
        # so no other user of a node can make the path first
        scratch_base=f"{given.scratch.rstrip('/')}/rbfan-{spec.name}",
        topology=(given.topology or "") if clush else None,
        # sbcast --fanout: how many nodes this machine sends the bundle to; they forward it
        # through Slurm's message tree (the head sends exactly fanout copies, whatever the node
        # count). sbcast's own default is 8; ours is 2 (width sets it, at most 8)
        copy_opts=None if clush else (f"--fanout={min(given.width or fanout.SBCAST_FANOUT, 8)}",),
        engine_opts=tuple(engine_opts) if clush else None,
        clush=tuple(starts) if clush else None,
    )
