"""Every step of a runbook, described once: its one-line summary (`--list`, the comment above the
step's function, `compile --plan`), the host it is mostly about, the spec entry it comes from, and
the single-host install (`SingleHost`, one of the two install strategies resolve.py picks from;
the other is fanout.FanOut): its steps, their `--dry-run` previews, its partials. Previews are
made from the decisions alone (view.Decisions, before any text); the names beside the destination
come from them (rbrules.paths' rules).

The destination-side steps are the install engine's (hostkit/rbkit/engine.py, STEPS): a
single-host runbook runs them one by one through the engine on the destination, a fan-out node
runs them all in its own process.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from rbrules import common, launch

if TYPE_CHECKING:
    from .view import Array, Decisions, Plan, Setting, Transfer

ENGINE_DOCS = {
    "stage": "make a fresh staging beside the destination (on a re-run: unchanged files "
    "hard-linked from the current install)",
    "receive": "unpack the tar stream into the staging",
    "verify": "check the staging against the manifest: every file, mode, link and digest",
    "relocate": "rewrite what names the old path (shebangs, activate scripts) for the new one",
    "prove": "the staged interpreter runs here and reports the staging as sys.prefix",
    "swap": "put the proven copy in place in one rename, then prove it there (sys.prefix, "
    "the console scripts); a failure puts back what was there",
    "exports": "write the env file: CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv's libs first",
    "probe": "run the checks with the moved interpreter",
}

SINGLE_HOST = (
    "preflight",
    "manifest",
    "transfer",
    "verify",
    "relocate",
    "prove",
    "swap",
    "exports",
    "probe",
)
FANOUT = ("fan_preflight", "fan_pack", "fan_copy", "fan_install", "fan_compare")


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


DOCS = {
    "preflight": "Reach every host, ship the kit, check the source is a venv after the excludes, "
    "take the destination's lock, check its state and free space.",
    "manifest": "Hash every file of the source (in parallel) into a manifest; detect a re-run "
    "and what an incremental one must send.",
    "transfer": "Stream the source into a staging directory beside the destination.",
    **{s: _sentence(ENGINE_DOCS[s]) for s in ("verify", "relocate", "prove", "swap", "exports")},
    "probe": "Run the checks with the moved interpreter on the target; fetch the report.",
    "fan_preflight": "Reach the source, check the engine and its tools here, list the nodes.",
    "fan_pack": "Pack the source once: manifest, tar with the chosen compression, the kit: one "
    "bundle (on a re-run: only what changed since the last fan-out).",
    "fan_copy": "Let the engine carry the bundle to every node (sbcast, or clush --copy).",
    "fan_install": "On every node at once, the install engine: "
    + ", ".join(common.ENGINE_STEPS)
    + " (a node the changes alone cannot serve gets the whole bundle).",
    "fan_compare": "Fetch every node's report and compare: nodes x checks, odd and missing nodes "
    "named.",
}
# the spec entry each step comes from (the `(specs/x.yaml:14)` marker above the step)
WHERE = {
    "preflight": ("hosts",),
    "manifest": ("transfer", "verify"),
    "transfer": ("transfer",),
    "verify": ("transfer", "verify"),
    "relocate": ("transfer", "to"),
    "prove": ("transfer", "to"),
    "swap": ("transfer", "on_existing"),
    "exports": ("cuda",),
    "probe": ("checks",),
    "fan_preflight": ("fanout",),
    "fan_pack": ("transfer",),
    "fan_copy": ("fanout",),
    "fan_install": ("fanout",),
    "fan_compare": ("fanout",),
}


def host(step: str, transfer: Transfer) -> str:
    """The host a step is mostly about (named in its log lines and the report)."""
    src_host, dst_host = transfer.src_host, transfer.dst_host
    if step == "manifest":
        return src_host
    if step in ("preflight", "transfer"):
        return src_host if src_host == dst_host else f"{src_host}->{dst_host}"
    return dst_host


@dataclass(frozen=True)
class SingleHost:
    """The install on one destination: the stream into its staging, then the engine's steps one
    by one there (the strategy resolve picks for a spec without `fanout:`)."""

    # what `compression: auto` takes where it is not measured, the first that every end has
    # (else none): lz4 first (docs/benchmarks.md)
    auto_compression = ("lz4", "zstd")
    partials = ()
    streams = True
    fanout = None

    def step_ids(self, checks_run: bool) -> tuple[str, ...]:
        return tuple(s for s in SINGLE_HOST if s != "probe" or checks_run)

    def settings(self) -> list[Setting]:
        return []

    def arrays(self) -> list[Array]:
        return []

    def compression_note(self, plan: Decisions) -> str:
        """The stream's compression as the run decides it (rb::preflight_compression's rule)."""
        transfer = plan.transfer
        compression = transfer.compression
        if compression == "auto" and transfer.src_host == transfer.dst_host and plan.hosts[0].local:
            return "none (both ends are this machine: no link to save)"
        if compression == "auto":
            return (
                "decided at run time: on the relay, measured: the link's rate (zeros through "
                f"this machine for {common.LINK_SECONDS} s) against each compressor both ends "
                f"have, packing a {common.MEASURE_SAMPLE >> 20} MiB sample of the source on "
                "the source: the fastest way through; where "
                "that cannot run, and on the direct route, none if every machine the stream "
                "passes through runs one kernel (the same boot id: no link to save), else "
                + ", else ".join(
                    f"{tool} -1 if both ends have {tool}" for tool in self.auto_compression
                )
                + ", else none"
            )
        return fixed_compression_note(compression)

    # compile --plan's words for where it installs (`code` marks a value as inline code)
    def installs_on(self, plan: Plan, code: Callable[[str], str]) -> str:
        return code(plan.transfer.dst_host)

    def checks_on(self, plan: Plan, code: Callable[[str], str]) -> str:
        return code(plan.transfer.dst_host)

    def route_lines(self, plan: Plan, code: Callable[[str], str]) -> list[str]:
        return []

    def preview(self, step: str, plan: Decisions) -> list[str]:
        """What `--dry-run` prints for a step: the commands, on which host, in plain words."""
        t, destination, checks = plan.transfer, plan.destination, plan.checks
        src_host, src, dst_host, dst = t.src_host, t.src_path, t.dst_host, t.dst_path
        stg = destination.staging
        excl = " ".join(shlex.quote(w) for w in t.exclude_args)
        on_dst = f"on {dst_host}: engine"
        tar_b = " ".join(common.TAR_RECORD)
        out: list[str] = []
        if step == "preflight":
            for h in plan.hosts:
                ship = (
                    "use the kit here"
                    if h.local
                    else "copy the kit to a private directory (mktemp -d), checked by its sha256"
                )
                out.append(f"on {h.id}: connect; {ship}; check tar and python3 >= 3.9")
            out.append(
                f"on {src_host}: rbkit engine scan {src} {excl}".rstrip()
                + " (refused unless pyvenv.cfg, bin/python and files are sent)"
            )
            out.append(
                f"on {dst_host}: rbkit engine serve --dest {dst}: refuses a parent of it "
                f"another user can write (shared_parent: {destination.shared_parent}); takes "
                f"{destination.lock} for the run (a second run is refused, naming this one)"
            )
            out.append(
                f"{on_dst} preflight: on_existing {destination.on_existing}; free space for {stg}"
            )
            out.append(audit_line(plan))
            out.append(f"compression: {self.compression_note(plan)}")
        elif step == "manifest":
            out.append(
                f"on {src_host}: rbkit engine hash {src} {excl} --algo {t.verify}"
                f" --jobs {t.jobs} --scanned <preflight's scan of it>".replace("  ", " ")
            )
            out.append(
                f"here: keep a copy in runs/{plan.runbook.name}/manifest.jsonl; send it to "
                f"{dst_host}"
            )
            out.append(f"{on_dst} current: if {dst}/.rb-manifest.jsonl matches, skip the install")
            if t.incremental:
                out.append(
                    f"{on_dst} stage: if it differs, link unchanged files from {dst} into "
                    f"{stg}, send only the rest"
                )
        elif step == "transfer":
            out.append(f"{on_dst} stage: rm -rf {stg} && mkdir {stg}")
            out.append(
                f"on {src_host}: tar -C {src} {tar_b} --null --no-recursion -T <names to "
                f"send> -cf - | <compress: {self.compression_note(plan)}> (rbkit engine send)"
            )
            streams = (
                f"streams side by side from {common.STREAMS_MIN_BYTES >> 20} MB: one per "
                f"two of the {t.jobs} jobs, at most {common.MAX_STREAMS}"
            )
            if src_host == dst_host:
                out.append(f"  | a pipe on {src_host}, no ssh ({streams}) |")
            elif t.route == "direct":
                out.append(f"  | ssh from {src_host} to {dst_host} (direct; {streams}) |")
            elif t.route == "auto":
                out.append(
                    f"  | ssh from {src_host} to {dst_host} where it reaches it (direct; "
                    f"{streams}), else through this machine (relay; {streams}, jobs: the "
                    "fewest of the three machines; each stream its own ssh clients here) |"
                )
            else:
                out.append(
                    f"  | through this machine ({t.route}; {streams}, jobs: the fewest of "
                    "the three machines; each stream its own ssh clients here) |"
                )
            out.append(
                f"on {dst_host}: <decompress> | tar -C {stg} {tar_b} -xf - --no-same-owner "
                "(rbkit engine receive; how much tar has read, every 5 s)"
            )
        elif step == "verify":
            out.append(
                f"{on_dst} verify {stg} against the manifest (--jobs {t.jobs}); the stamp "
                "relocate, prove and swap require"
            )
        elif step == "relocate":
            out.append(f"{on_dst} relocate {stg} --old {src} --new {dst}")
        elif step == "prove":
            out.append(
                f"on {dst_host}: {stg}/bin/python -I -B -c 'import sys; print(sys.prefix)' "
                f"(within {common.PROVE_TIMEOUT} s)"
            )
        elif step == "swap":
            out.append(
                f"{on_dst} swap: {stg} into {dst} (on_existing: {destination.on_existing}, from "
                "the engine's choices)"
            )
            out.append(
                f"on {dst_host}: {dst}/bin/python -c 'import sys; print(sys.prefix)'; "
                f"each console script (one per interpreter line) started to its sys.prefix; "
                f"on failure put back what was there"
            )
        elif step == "exports":
            out.append(f"{on_dst} exports: write {destination.env_path}")
            if destination.cuda_home:
                first = ", ".join(destination.library_path_first) or "-"
                out.append(
                    f"  CUDA_HOME={destination.cuda_home}; LD_LIBRARY_PATH: {first} (in "
                    "site-packages), then $CUDA_HOME/lib64"
                )
        elif step == "probe":
            flags = " ".join(launch.SITE_FLAGS)
            out.append(
                f"{on_dst} probe: source the env file; {dst}/bin/python {flags} "
                f"<kit>/{launch.START} rbprobes run: {', '.join(checks.kinds)}"
            )
            out.append(
                f"here: fetch the report to runs/{plan.runbook.name}/<run>/probe-{dst_host}.json"
            )
        return out


def fixed_compression_note(compression: str) -> str:
    """A compression the spec fixed (not auto), in words."""
    if compression == "none":
        return "none"
    return f"{compression} (preflight fails if an end lacks it)"


def audit_line(plan: Decisions) -> str:
    """What the static checks on the source run before anything moves (rb::preflight_audit)."""
    transfer, c = plan.transfer, plan.checks
    what = (
        f"rbprobes preflight --venv {transfer.src_path} --arch {c.audit_arch} "
        f"{' '.join(c.audit_args)}".rstrip()
        if c.audit_arch
        else f"rbprobes outside {transfer.src_path}"
    )
    return (
        f"on {transfer.src_host}: {what} (refused with the files and packages named unless "
        "--force; on one machine, references outside the venv are said, not refused)"
    )
