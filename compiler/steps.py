"""Every step of a runbook, described once: its one-line summary (`--list`, the comment above the
step's function, `compile --plan`), its `--dry-run` preview, the host it is mostly about and the
spec entry it comes from. plan.py, planmd.py and fanout.py read it; nothing else words a step.

The destination-side steps are the install engine's (hostkit/rbkit/engine.py, ENGINE_STEPS): a
single-host runbook runs them one by one through the engine on the destination, a fan-out node
runs them all in its own process. The staging path has one rule (`staging`), the engine's
`staging_path` (a test holds the two equal).
"""

from __future__ import annotations

import shlex
from typing import Any

from rbrules import launch, paths

from . import implied

# rbkit.stream's rule for streams side by side (a test holds the two equal): from this many MB,
# one stream per two jobs, at most this many
STREAMS_MIN_MB = 256
MAX_STREAMS = 8
# the install engine's steps, in order (rbkit.engine.STEPS)
ENGINE_STEPS = ("stage", "receive", "verify", "relocate", "prove", "swap", "exports", "probe")
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

SINGLE_HOST = ("preflight", "manifest", "transfer", "verify", "relocate", "prove", "swap",
               "exports", "probe")
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
    "fan_pack": "Pack the source once: manifest, tar with the chosen compression, the kit: one bundle"
                " (on a re-run: only what changed since the last fan-out).",
    "fan_copy": "Let the engine carry the bundle to every node (sbcast, or clush --copy).",
    "fan_install": "On every node at once, the install engine: " + ", ".join(ENGINE_STEPS)
                   + " (a node the changes alone cannot serve gets the whole bundle).",
    "fan_compare": "Fetch every node's report and compare: nodes x checks, odd and missing nodes named.",
}
# the spec entry each step comes from (the `(specs/x.yaml:14)` marker above the step)
WHERE = {
    "preflight": ("hosts",), "manifest": ("transfer", "verify"), "transfer": ("transfer",),
    "verify": ("transfer", "verify"), "relocate": ("transfer", "to"), "prove": ("transfer", "to"),
    "swap": ("transfer", "on_existing"), "exports": ("cuda",), "probe": ("checks",),
    "fan_preflight": ("fanout",), "fan_pack": ("transfer",), "fan_copy": ("fanout",),
    "fan_install": ("fanout",), "fan_compare": ("fanout",),
}


def staging(dest: str) -> str:
    """`.<name>.rb-staging` beside the destination: the kit's rule (rbrules.paths)."""
    return paths.staging(dest)


def step_list(spec: Any) -> list[str]:
    if spec.fanout:
        return list(FANOUT)
    return [s for s in SINGLE_HOST if s != "probe" or spec.checks]


def host(step: str, src_host: str, dst_host: str) -> str:
    """The host a step is mostly about (named in its log lines and the report)."""
    if step == "manifest":
        return src_host
    if step in ("preflight", "transfer"):
        return src_host if src_host == dst_host else f"{src_host}->{dst_host}"
    return dst_host


def preview(step: str, spec: Any, incremental: bool) -> list[str]:
    """What `--dry-run` prints for a step: the commands, on which host, in plain words."""
    if step in FANOUT:
        from . import fanout

        return fanout.preview(step, spec, incremental)
    src_host, src = spec.transfer.source
    dst_host, dst = spec.transfer.target
    stg = staging(dst)
    excl = " ".join(f"--exclude {shlex.quote(p)}" for p in spec.transfer.exclude)
    comp_note = compression_note(spec)
    jobs = spec.transfer.jobs or "auto"
    on_dst = f"on {dst_host}: engine"
    out: list[str] = []
    if step == "preflight":
        for h in dict.fromkeys([src_host, dst_host]):
            ship = "use the kit here" if spec.hosts[h].local else \
                "copy the kit to a private directory (mktemp -d), checked by its sha256"
            out.append(f"on {h}: connect; {ship}; check tar and python3 >= 3.9")
        out.append(f"on {src_host}: rbkit engine scan {src} {excl}".rstrip()
                   + " (refused unless pyvenv.cfg, bin/python and files are sent)")
        out.append(f"on {dst_host}: rbkit engine serve --dest {dst}: refuses a parent of it "
                   f"another user can write (shared_parent: {spec.transfer.shared_parent}); takes "
                   f"{lock(dst)} for the run (a second run is refused, naming this one)")
        out.append(f"{on_dst} preflight: on_existing {spec.transfer.on_existing}; free space for "
                   f"{stg}")
        out.append(audit_line(spec))
        out.append(f"compression: {comp_note}")
    elif step == "manifest":
        out.append(f"on {src_host}: rbkit engine hash {src} {excl} --algo {spec.transfer.verify}"
                   f" --jobs {jobs} --scanned <preflight's scan of it>".replace("  ", " "))
        out.append(f"here: keep a copy in runs/{spec.name}/manifest.jsonl; send it to {dst_host}")
        out.append(f"{on_dst} current: if {dst}/.rb-manifest.jsonl matches, skip the install")
        if incremental:
            out.append(f"{on_dst} stage: if it differs, link unchanged files from {dst} into "
                       f"{stg}, send only the rest")
    elif step == "transfer":
        out.append(f"{on_dst} stage: rm -rf {stg} && mkdir {stg}")
        out.append(f"on {src_host}: tar -C {src} -b 256 --null --no-recursion -T <names to send> -cf - "
                   f"| <compress: {comp_note}> (rbkit engine send)")
        streams = (f"streams side by side from {STREAMS_MIN_MB} MB: one per two of the {jobs} "
                   f"jobs, at most {MAX_STREAMS}")
        if src_host == dst_host:
            out.append(f"  | a pipe on {src_host}, no ssh ({streams}) |")
        elif spec.transfer.route == "direct":
            out.append(f"  | ssh from {src_host} to {dst_host} (direct; {streams}) |")
        elif spec.transfer.route == "auto":
            out.append(f"  | ssh from {src_host} to {dst_host} where it reaches it (direct; "
                       f"{streams}), else through this machine (relay; {streams}, jobs: the "
                       "fewest of the three machines; each stream its own ssh clients here) |")
        else:
            out.append(f"  | through this machine ({spec.transfer.route}; {streams}, jobs: the "
                       "fewest of the three machines; each stream its own ssh clients here) |")
        out.append(f"on {dst_host}: <decompress> | tar -C {stg} -b 256 -xf - --no-same-owner "
                   "(rbkit engine receive; how much tar has read, every 5 s)")
    elif step == "verify":
        out.append(f"{on_dst} verify {stg} against the manifest (--jobs {jobs}); the stamp "
                   "relocate, prove and swap require")
    elif step == "relocate":
        out.append(f"{on_dst} relocate {stg} --old {src} --new {dst}")
    elif step == "prove":
        out.append(f"on {dst_host}: {stg}/bin/python -I -B -c 'import sys; print(sys.prefix)' "
                   "(within 120 s)")
    elif step == "swap":
        out.append(f"{on_dst} swap {stg} {dst} --policy {spec.transfer.on_existing}")
        out.append(f"on {dst_host}: {dst}/bin/python -c 'import sys; print(sys.prefix)'; "
                   f"each console script (one per interpreter line) started to its sys.prefix; "
                   f"on failure put back what was there")
    elif step == "exports":
        env_file = paths.env_file(dst, spec.cuda.env_file if spec.cuda and spec.cuda.env_file
                                  else "")
        out.append(f"{on_dst} exports: write {env_file}")
        if spec.cuda:
            first = ", ".join(spec.cuda.library_path_first) or "-"
            out.append(f"  CUDA_HOME={spec.cuda.home}; LD_LIBRARY_PATH: {first} (in site-packages), "
                       f"then $CUDA_HOME/lib64")
    elif step == "probe":
        listed = [{"type": c.kind} for c in spec.checks]
        kinds = ", ".join(c["type"] for c in implied.implied_checks(spec, listed) + listed)
        flags = " ".join(launch.SITE_FLAGS)
        out.append(f"{on_dst} probe: source the env file; {dst}/bin/python {flags} "
                   f"<kit>/{launch.START} rbprobes run: {kinds}")
        out.append(f"here: fetch the report to runs/{spec.name}/<run>/probe-{dst_host}.json")
    return out


def auto_compression(spec: Any) -> tuple[str, ...]:
    """What `compression: auto` takes, the first that every end has (else none). A stream between
    two hosts: lz4 first, measured the best or within 5% of it on a CPU-bound relay (where zstd -1
    cost 8-20% over none) and on a 1 Gbit/s link (lz4 0.81x none's time, zstd 0.94x;
    docs/benchmarks.md). A fan-out bundle is written once and copied to every node: zstd first,
    for the smaller bundle."""
    return ("zstd", "lz4") if spec.fanout else ("lz4", "zstd")


def compression_note(spec: Any) -> str:
    """The stream's compression as the run decides it (rb::preflight_compression's rule)."""
    comp = spec.transfer.compression
    src_host, dst_host = spec.transfer.source[0], spec.transfer.target[0]
    if comp == "auto" and src_host == dst_host and spec.hosts[src_host].local and not spec.fanout:
        return "none (both ends are this machine: no link to save)"
    if comp == "auto":
        measured = "" if spec.fanout else (
            "on the relay, measured: the link's rate (zeros through this machine for 0.6 s) "
            "against each compressor both ends have, packing a 32 MiB sample of the source on "
            "the source: the fastest way through; where that cannot run, and on the direct route, ")
        one_kernel = "" if spec.fanout else (
            "none if every machine the stream passes through runs one kernel (the same boot id: "
            "no link to save), else ")
        return "decided at run time: " + measured + one_kernel + ", else ".join(
            f"{tool} -1 if both ends have {tool}" for tool in auto_compression(spec)) + ", else none"
    if comp == "none":
        return "none"
    return f"{comp} (preflight fails if an end lacks it)"


def audit_line(spec: Any) -> str:
    """What the static checks on the source run before anything moves (rb::preflight_audit)."""
    src_host, src = spec.transfer.source
    arch = implied.audit_arch(spec)
    what = (f"rbprobes preflight --venv {src} --arch {arch} {' '.join(implied.audit_args(spec))}"
            .rstrip() if arch else f"rbprobes outside {src}")
    return (f"on {src_host}: {what} (refused with the files and packages named unless --force; "
            "on one machine, references outside the venv are said, not refused)")


def lock(dest: str) -> str:
    """The destination's lock file (rbkit.lock.lock_path's rule)."""
    return paths.lock(dest)
