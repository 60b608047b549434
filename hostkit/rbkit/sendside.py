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


def cmd_scan(args: argparse.Namespace) -> int:
    answer = channel.Answer(sys.stdout)
    ctx = runner.Context(args.root, emit=answer.event, log=channel.log, trace=answer.trace)

    def scan(_ctx: runner.Context) -> runner.Result:
        try:
            detail, facts = stream.scan_source(
                args.root, args.exclude, args.names, args.special_modes, args.outside_links
            )
        except stream.SourceRefused as exc:
            raise runner.StepError(str(exc)) from None
        return runner.Result(detail, facts)

    runner.run(ctx, "scan", scan)
    return answer.done()


def cmd_source(args: argparse.Namespace) -> int:
    """The source's scan, then its static checks (source.py), in this one process. The answer
    channel is a copy of stdout; stdout itself becomes stderr (the checks print)."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    answer = channel.Answer(out)
    ctx = runner.Context(args.root, emit=answer.event, log=channel.log, trace=answer.trace)
    facts: Dict[str, Any] = {}
    # with cores to spare, the static checks run beside the scan: from the start when no earlier
    # pass can let them be skipped (--checks-beside auto), else as soon as the runbook's line says
    # none does (empty); cancelled when the scan fails or the line's fingerprint is the scan's
    beside = bool(args.audit) and source.spare_cores()
    early: List[Any] = (
        [source.EarlyAudit(args.audit)] if beside and args.checks_beside == "auto" else []
    )
    line: List[str] = [args.installed_stat]
    reader = None
    # the scan's walk forks its workers (where the host has the cores) before the reader thread
    # starts: a process forks only while it has one thread
    begun = hostfs.ScanWalk(
        args.root, args.exclude, args.special_modes == "strip", bool(args.names)
    )
    if args.installed_stat == "-":
        # the runbook learns it from the destination's engine while this scan runs

        def read_line() -> None:
            line[0] = sys.stdin.readline(4096).strip()
            if beside and not early and not line[0]:
                early.append(source.EarlyAudit(args.audit))

        reader = threading.Thread(target=read_line, daemon=True)
        reader.start()
    try:
        event = runner.run(
            ctx,
            "scan",
            source.scan,
            args.root,
            args.exclude,
            args.names,
            args.special_modes,
            args.outside_links,
            facts,
            begun,
        )
    finally:
        begun.close()
    if reader is not None:
        reader.join()
    started = early[0] if early else None
    if event["status"] != "failed" and args.library_dir:
        runner.run(ctx, "libraries", source.library_dirs, args.root, args.exclude, args.library_dir)
    if event["status"] != "failed":
        runner.run(
            ctx,
            "audit",
            source.audit,
            args.audit,
            facts.get("stat_fingerprint") or "",
            line[0],
            args.outside_links,
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


def cmd_hash(args: argparse.Namespace) -> int:
    answer = channel.Answer(sys.stdout)

    def build(ctx: runner.Context) -> runner.Result:
        reuse = manifestfile.load(args.reuse) if args.reuse else None
        mf = manifest.build(
            args.root,
            args.exclude,
            args.algo,
            hash_jobs(args.jobs, args.beside_stream),
            reuse,
            strip_special=args.special_modes == "strip",
            scanned=args.scanned,
        )
        manifestfile.save(mf, args.out, 0o600)
        if args.names:
            runner.write_file(
                args.names,
                b"".join(e["p"].encode("utf-8", "surrogateescape") + b"\0" for e in mf["entries"]),
                0o600,
            )
        totals = mf["totals"]
        fp = manifestfile.fingerprint(mf)
        return runner.Result(
            "%d files, %d symlinks, %s; fingerprint %s"
            % (totals["files"], totals["links"], args.algo, fp[:16]),
            {
                "files": totals["files"],
                "links": totals["links"],
                "bytes": totals["bytes"],
                "fingerprint": fp,
                "reused": mf["reused"],
            },
        )

    runner.run(
        runner.Context(args.root, emit=answer.event, log=channel.log, trace=answer.trace),
        "hash",
        build,
    )
    return answer.done()


def cmd_delta(args: argparse.Namespace) -> int:
    answer = channel.Answer(sys.stdout)

    def delta(ctx: runner.Context) -> runner.Result:
        facts = manifest.delta(manifestfile.load(args.manifest), manifestfile.load(args.base))
        runner.write_file(
            args.names_out,
            b"".join(n.encode("utf-8", "surrogateescape") + b"\0" for n in facts.pop("send")),
            0o600,
        )
        facts["usable"] = int(facts["usable"])
        return runner.Result(
            facts.get("why") or "%s files to send" % facts.get("send_files"), facts
        )

    runner.run(
        runner.Context(args.manifest, emit=answer.event, log=channel.log, trace=answer.trace),
        "delta",
        delta,
    )
    return answer.done()


def cmd_send(args: argparse.Namespace) -> int:
    if args.gate:
        return relay.gate_send(
            args.root, args.names, args.compression, args.gate, runner.jobs(args.jobs)
        )
    return sender.send(
        args.root,
        args.names,
        args.compression,
        args.remote or None,
        args.local or None,
        runner.jobs(args.jobs),
    )


def cmd_relay(args: argparse.Namespace) -> int:
    src = relay.End(args.src_name, args.src_ssh, args.src_kit, args.src_words)
    dst = relay.End(args.dst_name, args.dst_ssh, args.dst_kit, args.dst_words)
    return relay.Relay(
        src,
        dst,
        shlex.split(args.send),
        shlex.split(args.receive),
        args.parts,
        runner.jobs(args.jobs),
        args.compression,
        args.most,
        chosen=args.streams,
    ).run()
