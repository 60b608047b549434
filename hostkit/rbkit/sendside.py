"""The engine's commands of the sending side and the machine between (`rbkit engine scan`, `source`,
`hash`, `delta`, `send`, `relay`): serve.py's parser dispatches them, each answering on the same
channel (channel.py) as the destination's requests.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import threading
from typing import Any, Dict, List

from rbrules import cpus, paths

from . import (
    channel,
    hostfs,
    installs,
    manifest,
    manifestfile,
    relay,
    runner,
    sender,
    source,
    stream,
)


def cmd_scan(a: argparse.Namespace) -> int:
    answer = channel.Answer(sys.stdout)
    ctx = runner.Context(a.root, emit=answer.event, log=channel.log, trace=answer.trace)

    def scan(c: runner.Context) -> runner.Result:
        try:
            detail, facts = stream.scan_source(
                a.root, a.exclude, a.names, a.special_modes, a.outside_links
            )
        except stream.SourceRefused as exc:
            raise runner.StepError(str(exc)) from None
        return runner.Result(detail, facts)

    runner.run(ctx, "scan", scan)
    return answer.done()


def cmd_source(a: argparse.Namespace) -> int:
    """The source's scan, then its static checks (source.py), in this one process. The answer
    channel is a copy of stdout; stdout itself becomes stderr (the checks print)."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    answer = channel.Answer(out)
    ctx = runner.Context(a.root, emit=answer.event, log=channel.log, trace=answer.trace)
    facts: Dict[str, Any] = {}
    # with cores to spare, the static checks run beside the scan: from the start when no earlier
    # pass can let them be skipped (--checks-beside auto), else as soon as the runbook's line says
    # none does (empty); cancelled when the scan fails or the line's fingerprint is the scan's
    beside = bool(a.audit) and source.spare_cores()
    early: List[Any] = [source.EarlyAudit(a.audit)] if beside and a.checks_beside == "auto" else []
    line: List[str] = [a.installed_stat]
    reader = None
    # the scan's walk forks its workers (where the host has the cores) before the reader thread
    # starts: a process forks only while it has one thread
    begun = hostfs.ScanWalk(a.root, a.exclude, a.special_modes == "strip", bool(a.names))
    if a.installed_stat == "-":
        # the runbook learns it from the destination's engine while this scan runs

        def read_line() -> None:
            line[0] = sys.stdin.readline(4096).strip()
            if beside and not early and not line[0]:
                early.append(source.EarlyAudit(a.audit))

        reader = threading.Thread(target=read_line, daemon=True)
        reader.start()
    try:
        event = runner.run(
            ctx,
            "scan",
            source.scan,
            a.root,
            a.exclude,
            a.names,
            a.special_modes,
            a.outside_links,
            facts,
            begun,
        )
    finally:
        begun.close()
    if reader is not None:
        reader.join()
    started = early[0] if early else None
    if event["status"] != "failed" and a.library_dir:
        runner.run(ctx, "libraries", source.library_dirs, a.root, a.exclude, a.library_dir)
    if event["status"] != "failed":
        runner.run(
            ctx,
            "audit",
            source.audit,
            a.audit,
            facts.get("stat_fingerprint") or "",
            line[0],
            a.outside_links,
            started,
        )
    elif started is not None:
        started.cancel()
    return answer.done()


def installed_stat(dest: str) -> str:
    """The source stat fingerprint the install at dest recorded (its manifest's first line), or
    empty: read to let the source skip the static checks of a tree it already passed. An
    install not proven ours has none (installs.why_not_ours_install)."""
    if not os.path.isdir(dest) or installs.why_not_ours_install(dest):
        return ""
    header = manifestfile.read_header(os.path.join(dest, paths.INSTALLED_MANIFEST))
    if header is None:
        return ""
    value = header.get("source_stat_fingerprint")
    return value if isinstance(value, str) else ""


def hash_jobs(value: str, beside_stream: bool) -> int:
    """The source's hashing workers: --jobs; beside the stream, the cores its processes here
    (tar, the compressor, sshd's cipher: two) leave, one at least. On a host of two CPUs that is
    one process, not two forked workers: 0.18 CPU-s less for the lab's torch venv, taken from
    the stream's own processes there (docs/benchmarks.md, "The relay's CPU")."""
    jobs = runner.jobs(value)
    if beside_stream:
        jobs = min(jobs, max(1, cpus.count() - 2))
    return jobs


def cmd_hash(a: argparse.Namespace) -> int:
    answer = channel.Answer(sys.stdout)

    def build(ctx: runner.Context) -> runner.Result:
        reuse = manifestfile.load(a.reuse) if a.reuse else None
        m = manifest.build(
            a.root,
            a.exclude,
            a.algo,
            hash_jobs(a.jobs, a.beside_stream),
            reuse,
            strip_special=a.special_modes == "strip",
            scanned=a.scanned,
        )
        manifestfile.save(m, a.out, 0o600)
        if a.names:
            runner.write_file(
                a.names,
                b"".join(e["p"].encode("utf-8", "surrogateescape") + b"\0" for e in m["entries"]),
                0o600,
            )
        t = m["totals"]
        fp = manifestfile.fingerprint(m)
        return runner.Result(
            "%d files, %d symlinks, %s; fingerprint %s" % (t["files"], t["links"], a.algo, fp[:16]),
            {
                "files": t["files"],
                "links": t["links"],
                "bytes": t["bytes"],
                "fingerprint": fp,
                "reused": m["reused"],
            },
        )

    runner.run(
        runner.Context(a.root, emit=answer.event, log=channel.log, trace=answer.trace),
        "hash",
        build,
    )
    return answer.done()


def cmd_delta(a: argparse.Namespace) -> int:
    answer = channel.Answer(sys.stdout)

    def delta(ctx: runner.Context) -> runner.Result:
        d = manifest.delta(manifestfile.load(a.manifest), manifestfile.load(a.base))
        runner.write_file(
            a.names_out,
            b"".join(n.encode("utf-8", "surrogateescape") + b"\0" for n in d.pop("send")),
            0o600,
        )
        d["usable"] = int(d["usable"])
        return runner.Result(d.get("why") or "%s files to send" % d.get("send_files"), d)

    runner.run(
        runner.Context(a.manifest, emit=answer.event, log=channel.log, trace=answer.trace),
        "delta",
        delta,
    )
    return answer.done()


def cmd_send(a: argparse.Namespace) -> int:
    if a.gate:
        return relay.gate_send(a.root, a.names, a.compression, a.gate, runner.jobs(a.jobs))
    return sender.send(
        a.root, a.names, a.compression, a.remote or None, a.local or None, runner.jobs(a.jobs)
    )


def cmd_relay(a: argparse.Namespace) -> int:
    src = relay.End(a.src_name, a.src_ssh, a.src_kit, a.src_words)
    dst = relay.End(a.dst_name, a.dst_ssh, a.dst_kit, a.dst_words)
    return relay.Relay(
        src,
        dst,
        shlex.split(a.send),
        shlex.split(a.receive),
        a.parts,
        runner.jobs(a.jobs),
        a.compression,
        a.most,
    ).run()
