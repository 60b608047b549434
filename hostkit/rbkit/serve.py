"""`python -m rbkit engine ...`: the install engine's command line (engine.py has the steps).

    engine serve --dest D --choices JSON [the run's facts] --holder TEXT
                                                               the destination's engine for a run
    engine receive --dest D --state S --compression C --choices JSON [--progress S] [--part I/N]
        [--need BYTES]
                                                               the far end of the stream (stdin)
    engine run STEP... --dest D --choices JSON [the run's facts]   steps in one process (tests)
    engine scan ROOT [--exclude P]... [--names F]              the source before anything is sent
    engine source ROOT [scan's options] [--installed-stat FP|-] --audit RBPROBES-ARGV...
                                                               scan and static checks, one process
    engine hash ROOT --out F [--exclude P]... [--algo A] [--jobs N] [--names F] [--reuse F]
        [--scanned NAMES.stat]                                     (the entries this run's scan saw)
    engine delta MANIFEST BASE --names-out F                   what a host installed from BASE needs
    engine send ROOT NAMES --compression C [--jobs N] [--remote SSH... | --local RECEIVE...]
                                                               the sending end of the stream(s)
    engine relay --src-name H --src-ssh W --src-kit D --src-words W (and --dst-...) --send W
        --receive W --parts PREFIX [--jobs N]                  (here) the relay, in streams
    engine staging DEST                                        the staging path (the one rule)

Every command but send and staging answers in lines a runbook reads without a parser:

    set<TAB>KEY<TAB>VALUE      a fact of the step (also inside its event)
    event<TAB>{JSON}           the step's event (engine.py: step, status, detail, facts, duration_s)
    done<TAB>STATUS<TAB>DETAIL the end of the answer: ok, skipped or failed, and why
    ping                       (serve only) the engine is alive; ignored
    log<TAB>TEXT               a line for the run's log file only, never the terminal (a failed
                               step's traceback)
    progress<TAB>BYTES         (receive --progress S only) how much of the tar stream tar has read,
                               every S seconds and once at its end

`--choices` is the spec's choices for the engine, one JSON document (choices.py: read by
Choices.from_json, which refuses a document it cannot read before anything is done); the other
options are the facts of this run: the source's path (--old), the source's manifest here
(--manifest), the compression the run uses, the checks' document (--probe-config).

`serve` takes the destination's lock (lock.py), makes its private state directory (the stamp, the
names a re-run sends, the checks' report: `set state PATH` in its first answer), answers `done`
once it holds the lock (with `set installed_stat FP`: the source stat fingerprint the install
there recorded, empty when none), then reads requests from stdin: words each ended by NUL, a
request ended by an empty word (`verify\\0\\0`, `preflight\\0need=123\\0\\0`). Each request runs one
step (a failure past the swap is followed by its rollback); at the end of stdin it finishes the run
(replace: the install the swap replaced is removed), lets go of the lock and removes its state.
Human lines go to stderr, as they happen. It writes `ping` every few seconds, so that the runbook
knows it alive during a long step, and an ssh session whose runbook is gone (a link down) is
noticed and the lock let go.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
from typing import Any, Dict, List, Optional

from rbrules import choices, compression, enginerules, streams

from . import (
    backups,
    channel,
    engine,
    preflight,
    probestep,
    proof,
    receive,
    relay,
    runner,
    sendside,
    staging,
)
from .choices import add_choices_option, add_run_options
from .lock import Lock

PING_S = 5.0
LOCK_WAIT_S = float(enginerules.LOCK_WAIT_S)


def context(args: argparse.Namespace, **kw: Any) -> runner.Context:
    return runner.Context(
        args.dest,
        args.choices,
        old=args.old,
        manifest=args.manifest,
        compression=args.compression,
        probe_config=args.probe_config,
        **kw,
    )


# what a request may ask: the step's function and how its key=value words are read
REQUESTS: Dict[str, tuple] = {
    "preflight": (preflight.preflight, {"need": int, "source_identity": str, "source": str}),
    "discard": (staging.discard_staging, {}),
    "current": (engine.current, {"mode": str, "source_stat": str}),
    "stage": (
        staging.stage,
        {
            "delta": lambda v: v == "1",
            "source_stat": str,
            "algo": str,
            "exclude": list,
            "source": str,
            "resume": lambda v: v == "1",
        },
    ),
    "resumable": (staging.resumable, {"source": str}),
    "verify": (proof.verify, {}),
    "relocate": (engine.relocate_staging, {}),
    "prove": (proof.prove, {}),
    "swap": (engine.swap, {}),
    "exports": (engine.write_exports, {}),
    "probe": (probestep.probe, {"report": str}),
    "restore": (backups.restore, {"number": int}),
    "backups": (backups.list_backups, {}),
}


def handle(ctx: runner.Context, words: List[str]) -> None:
    """One request: its step, as engine.step runs it (skipped when the destination already holds
    the tree, a failure past the swap rolled back)."""
    name, params = words[0], {}
    fn, types = REQUESTS.get(name, (None, {}))
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key not in types:
            fn = None
            break
        if types[key] is list:  # a key that may be given again: each a value
            params.setdefault(key, []).append(value)
        else:
            params[key] = types[key](value)
    if fn is None:
        runner.run(ctx, name, _refuse, " ".join(words))
        return
    engine.step(ctx, name, fn, **params)


def _refuse(ctx: runner.Context, what: str) -> runner.Result:
    raise runner.StepError("the engine does not know this request: %s" % what)


def _requests(fd: int):
    """Requests from fd: words ended by NUL, a request ended by an empty word; None at the end."""
    buf = b""
    words: List[str] = []
    while True:
        while b"\0" not in buf:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buf += chunk
        word, buf = buf.split(b"\0", 1)
        if word:
            words.append(word.decode("utf-8", "surrogateescape"))
        elif words:
            yield words
            words = []


def serve(args: argparse.Namespace) -> int:
    # the answer channel is a copy of stdout; stdout itself becomes stderr, so that nothing a
    # step or a child prints can be taken for an answer
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    answer = channel.Answer(out)
    ctx = context(args, emit=answer.event, log=channel.log, trace=answer.trace)
    ctx.state = runner.make_state()
    lock = Lock(ctx.dest, args.holder, args.lock_wait, channel.log)
    stop = {"asked": False}

    def on_signal(signum: int, frame: Any) -> None:
        if stop["asked"]:
            return  # stopping already (the group's signal, then the runbook's)
        stop["asked"] = True
        if ctx.critical == 0:
            raise channel.Stop()

    def ping() -> None:
        # also while a step works: the runbook reads its answers with a bound between two lines
        while True:
            threading.Event().wait(PING_S)
            try:
                answer.line("ping")
            except (OSError, ValueError):
                os.kill(os.getpid(), signal.SIGTERM)  # the runbook is gone
                return

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runbook's Ctrl-C: it closes our stdin
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    rc = 0
    try:
        runner.run(ctx, "lock", preflight.take_lock, lock)
        preflight.begin_early_check(ctx)
        answer.line("set", "installed_stat", sendside.installed_stat(ctx.dest))
        if answer.done():
            return 1
        threading.Thread(target=ping, daemon=True).start()
        for words in _requests(0):
            handle(ctx, words)
            answer.done()
            if stop["asked"]:
                raise channel.Stop()
        engine.finish(ctx)
        answer.done()
    except channel.Stop:
        channel.log("the engine on %s stops: its runbook is gone or it was told to" % ctx.dest)
        rc = 1
    except BrokenPipeError:
        rc = 1
    finally:
        # once stopping, a second signal (the group's, then the runbook's own TERM) must not cut
        # the release of the lock and the removal of the state short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        proof.stop_background(ctx)
        lock.release()
        shutil.rmtree(ctx.state, ignore_errors=True)
    return rc


def cmd_run(args: argparse.Namespace) -> int:
    """Steps in order, in this process, under the lock; stops at the first failure."""
    answer = channel.Answer(sys.stdout)
    ctx = context(args, emit=answer.event, log=channel.log, trace=answer.trace)
    ctx.state = runner.make_state()
    lock = Lock(ctx.dest, args.holder, args.lock_wait, channel.log)
    try:
        runner.run(ctx, "lock", preflight.take_lock, lock)
        if answer.done():
            return 1
        for step in args.steps:
            words = [step] + (["mode=" + ctx.choices.rerun] if step == "current" else [])
            handle(ctx, words)
            if answer.done():
                return 1
        engine.finish(ctx)
        answer.done()
        return 0
    finally:
        proof.stop_background(ctx)
        lock.release()
        shutil.rmtree(ctx.state, ignore_errors=True)


def cmd_receive(args: argparse.Namespace) -> int:
    if args.gate:
        part = relay.gate_receive(runner.jobs(args.choices.jobs))
        if part is False:
            return 3  # stopped before anything came: nothing received
        args.part = part
    answer = channel.Answer(sys.stdout)
    ctx = runner.Context(
        args.dest,
        args.choices,
        compression=args.compression,
        state=args.state,
        log=channel.log,
        emit=answer.event,
        trace=answer.trace,
    )
    if args.progress > 0:
        ctx.progress = (args.progress, lambda n: answer.line("progress", n))
    ctx.part = args.part
    event = runner.run(ctx, "receive", receive.receive, need=args.need)
    if event["status"] == "failed":
        # the runbook names the stage that failed (unpack on HOST); this says why, in its log
        channel.log("receive: %s" % event["detail"])
    return answer.done()


def _part(text: str) -> tuple:
    """--part I/N: stream I (0-based) of N."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError("not I/N: %r" % text) from None
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError("stream %d of %d" % (index, count))
    return (index, count)


def cmd_staging(args: argparse.Namespace) -> int:
    print(runner.staging_path(args.dest))
    return 0


def _choices(command: argparse.ArgumentParser) -> None:
    """serve's and run's options: the run's facts, the lock's holder and wait."""
    add_run_options(command)
    command.add_argument("--manifest", default="", help="the source's manifest on this host")
    command.add_argument(
        "--holder", default="rbkit engine", help="who holds the lock (named to others)"
    )
    command.add_argument(
        "--lock-wait",
        type=float,
        default=LOCK_WAIT_S,
        help="seconds to wait for a lock another run holds",
    )


def _scan_options(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The source's scan options (`scan`, and `source` which scans first)."""
    command.add_argument("root")
    command.add_argument("--exclude", action="append", default=[])
    command.add_argument("--names")
    command.add_argument("--special-modes", choices=choices.SPECIAL_MODES, default="refuse")
    command.add_argument("--outside-links", choices=choices.OUTSIDE_LINKS, default="refuse")
    return command


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rbkit engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve_cmd = sub.add_parser("serve")
    _choices(serve_cmd)
    serve_cmd.set_defaults(fn=serve)
    run_cmd = sub.add_parser("run")
    run_cmd.add_argument("steps", nargs="+", choices=["current"] + list(REQUESTS))
    _choices(run_cmd)
    run_cmd.set_defaults(fn=cmd_run)
    receive_cmd = sub.add_parser("receive")
    receive_cmd.add_argument("--dest", required=True)
    receive_cmd.add_argument("--state", required=True)
    receive_cmd.add_argument("--compression", type=compression.compression_word, default="none")
    add_choices_option(receive_cmd)
    receive_cmd.add_argument(
        "--progress",
        type=float,
        default=0.0,
        metavar="S",
        help="a `progress BYTES` line every S seconds (0: none)",
    )
    receive_cmd.add_argument(
        "--part",
        type=_part,
        default=None,
        metavar="I/N",
        help="this is stream I of N (rbkit send's streams side by side)",
    )
    receive_cmd.add_argument(
        "--need",
        type=int,
        default=0,
        metavar="BYTES",
        help="the bytes the whole staging holds once every stream arrived (a file "
        "system that fills says how many are still to come)",
    )
    receive_cmd.add_argument(
        "--gate",
        action="store_true",
        help="say `gate ready JOBS CPUS`, then wait for `go I N` on stdin (rbkit relay)",
    )
    receive_cmd.set_defaults(fn=cmd_receive)
    scan_cmd = _scan_options(sub.add_parser("scan"))
    scan_cmd.set_defaults(fn=sendside.cmd_scan)
    source_cmd = _scan_options(sub.add_parser("source"))
    source_cmd.add_argument(
        "--library-dir",
        action="append",
        default=[],
        help="a dir of site-packages the exports step puts first "
        "(cuda.library_path_first): said when the source lacks it",
    )
    source_cmd.add_argument(
        "--installed-stat",
        default="",
        help="the destination install's source stat fingerprint (equal: no checks); "
        "`-`: read it from stdin after the scan",
    )
    source_cmd.add_argument(
        "--checks-beside",
        choices=("auto", "no"),
        default="auto",
        help="auto: the static checks start with the scan on a host with cores to "
        "spare; no: once the installed stat (`-`) says they cannot be skipped",
    )
    source_cmd.add_argument(
        "--audit",
        action="store_true",
        help="the words after it: the rbprobes command line of the static checks",
    )
    source_cmd.set_defaults(fn=sendside.cmd_source)
    hash_cmd = sub.add_parser("hash")
    hash_cmd.add_argument("root")
    hash_cmd.add_argument("--exclude", action="append", default=[])
    hash_cmd.add_argument("--algo", choices=choices.ALGOS, default="sha256")
    hash_cmd.add_argument("--jobs", default="auto")
    hash_cmd.add_argument("--out", required=True)
    hash_cmd.add_argument("--names")
    hash_cmd.add_argument("--reuse")
    hash_cmd.add_argument(
        "--scanned",
        help="the scan record this run's `engine source` wrote (NAMES.stat):"
        " its entries, not a new walk",
    )
    hash_cmd.add_argument(
        "--special-modes",
        choices=choices.SPECIAL_MODES,
        default="refuse",
        help="strip: modes recorded without setuid/setgid/sticky/world-write",
    )
    hash_cmd.add_argument(
        "--beside-stream",
        action="store_true",
        help="the stream runs on this host meanwhile: workers only where it leaves cores",
    )
    hash_cmd.set_defaults(fn=sendside.cmd_hash)
    delta_cmd = sub.add_parser("delta")
    delta_cmd.add_argument("manifest")
    delta_cmd.add_argument("base")
    delta_cmd.add_argument("--names-out", required=True)
    delta_cmd.set_defaults(fn=sendside.cmd_delta)
    send_cmd = sub.add_parser("send")
    send_cmd.add_argument("root")
    send_cmd.add_argument("names")
    send_cmd.add_argument("--compression", type=compression.compression_word, default="none")
    send_cmd.add_argument(
        "--jobs",
        default="1",
        help="the cores the run may use here: one stream per two (rbkit stream)",
    )
    send_cmd.add_argument(
        "--remote",
        action="store_true",
        help="the words after it: an ssh command line the stream is piped into",
    )
    send_cmd.add_argument(
        "--local",
        action="store_true",
        help="the words after it: the receiving end's command, started here",
    )
    send_cmd.add_argument(
        "--gate",
        metavar="PREFIX",
        default="",
        help="say ready, then split into PREFIX.N/ and send as told (rbkit relay)",
    )
    send_cmd.set_defaults(fn=sendside.cmd_send)
    relay_cmd = sub.add_parser("relay")
    for end in ("src", "dst"):
        relay_cmd.add_argument("--%s-name" % end, required=True)
        relay_cmd.add_argument(
            "--%s-ssh" % end,
            default="",
            help="the host's ssh words, quoted for a shell (empty: this machine)",
        )
        relay_cmd.add_argument("--%s-kit" % end, required=True, help="the kit's directory there")
        relay_cmd.add_argument(
            "--%s-words" % end, required=True, help="the kit's words there, quoted"
        )
    relay_cmd.add_argument("--send", required=True, help="`engine send ...` for the source, quoted")
    relay_cmd.add_argument("--receive", required=True, help="`engine receive ...`, quoted")
    relay_cmd.add_argument("--parts", required=True, help="where the source end splits its list")
    relay_cmd.add_argument("--compression", type=compression.compression_word, default="none")
    relay_cmd.add_argument("--jobs", default="auto", help="the cores the run may use here")
    relay_cmd.add_argument("--most", type=int, default=streams.MAX_STREAMS)
    relay_cmd.add_argument(
        "--streams",
        type=int,
        default=0,
        help="the streams compression auto's model chose (0: the relay's own rule)",
    )
    relay_cmd.set_defaults(fn=sendside.cmd_relay)
    st = sub.add_parser("staging")
    st.add_argument("dest")
    st.set_defaults(fn=cmd_staging)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    remote: List[str] = []
    tail = {"send": "--remote", "source": "--audit"}.get(argv[0] if argv else "")
    if tail == "--remote":
        tail = next((w for w in argv if w in ("--remote", "--local")), tail)
    if tail and tail in argv:
        # every word after --remote (--local, --audit) is the ssh (receive's, rbprobes')
        # command line, options included
        at = argv.index(tail)
        argv, remote = argv[: at + 1], argv[at + 1 :]
    args = parser().parse_args(argv)
    if args.fn is sendside.cmd_send:
        args.remote, args.local = (remote, []) if tail == "--remote" else ([], remote)
    if args.fn is sendside.cmd_source:
        args.audit = remote
    return args.fn(args)
