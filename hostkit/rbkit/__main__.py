"""python -m rbkit (on hosts) / python -m rbkit (from the repo). See docs/design.md."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import exports, hostfs, manifest, relocate, report


def jobs(value: str) -> int:
    """--jobs N, or auto: one per CPU of this host (at most 32)."""
    if value == "auto":
        return max(1, min(32, os.cpu_count() or 1))
    return max(1, int(value))


def _print(doc) -> None:
    print(json.dumps(doc, sort_keys=True))


def cmd_manifest_build(a) -> int:
    m = manifest.build(a.root, a.exclude, a.algo, a.jobs,
                       manifest.load(a.reuse) if a.reuse else None)
    tmp = f"{a.out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        manifest.dump(m, f)
    os.replace(tmp, a.out)
    if a.names:
        with open(a.names, "wb") as f:
            manifest.names(m, f)
    _print({"totals": m["totals"], "fingerprint": manifest.fingerprint(m), "reused": m["reused"]})
    return 0


def cmd_manifest_verify(a) -> int:
    result = manifest.verify(a.root, manifest.load(a.manifest), a.jobs,
                             linked_from=a.linked_from)
    for line in manifest.describe(result):
        print(line, file=sys.stderr)
    _print({k: result[k] for k in ("ok", "algo", "checked", "hashed", "linked", "counts")})
    return 0 if result["ok"] else 1


def cmd_manifest_fingerprint(a) -> int:
    m = manifest.load(a.manifest)
    _print({"fingerprint": manifest.fingerprint(m), "source_fingerprint":
            m["header"].get("source_fingerprint"), "totals": m["totals"]})
    return 0


def cmd_manifest_quick(a) -> int:
    result = manifest.quick_check(a.root, manifest.load(a.installed), a.source_stat)
    for rel in result.get("changed", []):
        print(f"changed at the destination: {rel}", file=sys.stderr)
    _print(result)
    return 0 if result["ok"] else 1


def cmd_manifest_delta(a) -> int:
    d = manifest.delta(manifest.load(a.manifest), manifest.load(a.base))
    with open(a.names_out, "wb") as f:
        manifest.write_names(d.pop("send"), f)
    _print(d)
    return 0


def cmd_stage(a) -> int:
    _print(hostfs.stage(a.dest, a.staging, manifest.load(a.manifest), manifest.load(a.installed),
                        a.names_out))
    return 0


def cmd_relocate(a) -> int:
    result = relocate.relocate(a.root, a.old, a.new)
    if a.manifest and a.installed:
        m = manifest.load(a.manifest)
        algo = m["header"]["algo"]
        changes = {}
        for rel, info in result["rewritten"].items():
            change = {"s": info["s"]}
            if algo != "none":
                change["h"] = manifest.digest(os.path.join(a.root, rel), algo)
            changes[rel] = change
        installed = manifest.relocated(m, changes, manifest.fingerprint(m))
        with open(a.installed, "w", encoding="utf-8") as f:
            manifest.dump(installed, f)
    for rel in result["remaining"]:
        print(f"still names {a.old}: {rel}", file=sys.stderr)
    _print({"rewritten": sorted(result["rewritten"]), "count": len(result["rewritten"]),
            "remaining": result["remaining"],
            "elsewhere": result["elsewhere"], "same_path": result["same_path"]})
    return 1 if result["remaining"] else 0


def cmd_scan(a) -> int:
    _print(hostfs.scan(a.root, a.exclude, a.names))
    return 0


def cmd_free(a) -> int:
    _print(hostfs.free_bytes(a.path))
    return 0


def cmd_swap(a) -> int:
    _print(hostfs.swap(a.staging, a.dest, a.policy))
    return 0


def cmd_restore(a) -> int:
    _print(hostfs.restore(a.dest, a.number))
    return 0


def cmd_exports(a) -> int:
    env = dict(item.split("=", 1) for item in a.env)
    text, summary = exports.render(a.venv, a.cuda_home, a.first, env, a.origin)
    if summary["missing_dirs"]:
        for d in summary["missing_dirs"]:
            print(f"library dir does not exist in the venv: {d}", file=sys.stderr)
        _print(summary)
        return 1
    exports.write(a.out, text)
    _print(dict(summary, file=a.out))
    return 0


def cmd_report(a) -> int:
    probes = dict(item.split("=", 1) for item in a.probe)
    doc = report.build(a.name, a.spec, a.sha, a.events, probes, a.outcome)
    tmp = f"{a.out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, a.out)
    print(report.table(doc), file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rbkit", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest").add_subparsers(dest="mcmd", required=True)
    b = m.add_parser("build")
    b.add_argument("root")
    b.add_argument("--exclude", action="append", default=[])
    b.add_argument("--algo", choices=("sha256", "blake2b", "none"), default="sha256")
    b.add_argument("--jobs", type=jobs, default="auto")
    b.add_argument("--out", required=True)
    b.add_argument("--names")
    b.add_argument("--reuse", help="an earlier install's manifest: unchanged files keep its digest")
    b.set_defaults(fn=cmd_manifest_build)
    v = m.add_parser("verify")
    v.add_argument("root")
    v.add_argument("manifest")
    v.add_argument("--jobs", type=jobs, default="auto")
    v.add_argument("--linked-from", help="files hard-linked from here are checked by stat")
    v.set_defaults(fn=cmd_manifest_verify)
    q = m.add_parser("quick-check")
    q.add_argument("root")
    q.add_argument("installed")
    q.add_argument("--source-stat", required=True)
    q.set_defaults(fn=cmd_manifest_quick)
    fp = m.add_parser("fingerprint")
    fp.add_argument("manifest")
    fp.set_defaults(fn=cmd_manifest_fingerprint)
    d = m.add_parser("delta", help="what a host installed from BASE still needs (manifest.delta)")
    d.add_argument("manifest")
    d.add_argument("base")
    d.add_argument("--names-out", required=True)
    d.set_defaults(fn=cmd_manifest_delta)
    r = sub.add_parser("relocate")
    r.add_argument("root")
    r.add_argument("--old", required=True)
    r.add_argument("--new", required=True)
    r.add_argument("--manifest")
    r.add_argument("--installed")
    r.set_defaults(fn=cmd_relocate)
    st = sub.add_parser("stage", help="an incremental install's staging (hostfs.stage)")
    st.add_argument("dest")
    st.add_argument("staging")
    st.add_argument("--manifest", required=True)
    st.add_argument("--installed", required=True)
    st.add_argument("--names-out", required=True)
    st.set_defaults(fn=cmd_stage)
    s = sub.add_parser("scan")
    s.add_argument("root")
    s.add_argument("--exclude", action="append", default=[])
    s.add_argument("--names", help="also write the NUL-separated name list for tar -T here")
    s.set_defaults(fn=cmd_scan)
    fr = sub.add_parser("free")
    fr.add_argument("path")
    fr.set_defaults(fn=cmd_free)
    sw = sub.add_parser("swap")
    sw.add_argument("staging")
    sw.add_argument("dest")
    sw.add_argument("--policy", choices=("refuse", "backup", "replace"), required=True)
    sw.set_defaults(fn=cmd_swap)
    rs = sub.add_parser("restore")
    rs.add_argument("dest")
    rs.add_argument("--number", type=int)
    rs.set_defaults(fn=cmd_restore)
    e = sub.add_parser("exports")
    e.add_argument("--venv", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--cuda-home", default="")
    e.add_argument("--first", action="append", default=[])
    e.add_argument("--env", action="append", default=[])
    e.add_argument("--origin", default="a runbook")
    e.set_defaults(fn=cmd_exports)
    rp = sub.add_parser("report")
    rp.add_argument("--name", required=True)
    rp.add_argument("--spec", required=True)
    rp.add_argument("--sha", required=True)
    rp.add_argument("--events", required=True)
    rp.add_argument("--probe", action="append", default=[])
    rp.add_argument("--outcome", required=True)
    rp.add_argument("--out", required=True)
    rp.set_defaults(fn=cmd_report)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["engine"]:
        from . import serve          # the install engine's own command line (serve.py)

        return serve.main(argv[1:])
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except (OSError, ValueError) as exc:
        print(f"rbkit {a.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
