"""The files ssh reads for a host, judged before ssh uses them (docs/design.md, "Other users of
the same hosts"): the spec's ssh config file (`-F`: ssh runs what it names, ProxyCommand and
`Match exec`, on this machine, even for `ssh -G`), then every known_hosts file ssh will really
read for the host, as `ssh -G` says after `-F`, the alias and `Match`, not only the spec's
`options:` words. A known_hosts file decides which host keys this machine trusts, so it is judged
as the config file is (rbrules.private: a regular file that only this user or root can change,
nor any directory above it); one that is /dev/null, `none` or in /dev, /proc or /sys knows no
key, and `accept-new` then takes any key, a changed one too.

    python -I -S -B KIT/rbrules/start.py rbrules.sshfiles --host NAME --target USER@HOST -- WORDS...

WORDS are the host's ssh options as the runbook gives them (RB_HOST_SSH). Exit 0 when every file
passes; 2 with the refusal on stderr (the file, the host, the fix); 3 with ssh's own words when
`ssh -G` fails (a config ssh cannot read). The compiler imports the names' rule (known_hosts_path,
OFF, SYSTEM) for the spec's `options:` (compiler/sshopts.py).
"""

from __future__ import annotations

import argparse
import os
import posixpath
import stat
import sys
from typing import Dict, List, Optional

from rbrules import owners, private

OFF = ("/dev/null", "none")  # a known_hosts "file" that knows no key
KNOWN_HOSTS = ("userknownhostsfile", "globalknownhostsfile")  # by their lower-case names
SPELLED = {
    "userknownhostsfile": "UserKnownHostsFile",
    "globalknownhostsfile": "GlobalKnownHostsFile",
}
# where a known_hosts file cannot be: what is there is not a file that keeps keys
SYSTEM = {
    "dev": "a device",
    "proc": "the kernel's view of processes",
    "sys": "the kernel's view of devices",
}
G_SECONDS = 30  # ssh -G connects nowhere; a config's Match exec may take time


class Refused(Exception):
    """A file ssh would read for the host, refused: the message names it, the host and the fix."""


class SshSaid(Exception):
    """ssh -G failed: ssh's own words (a config file it cannot read)."""


def known_hosts_path(path: str) -> str:
    """A known_hosts file's name as the kernel reads it, lexically: `/dev/./null`, `//dev/null`
    and `/dev//null` are all /dev/null (posixpath.normpath keeps a leading `//`; Linux does not)."""
    if path.startswith("~/"):
        return "~/" + posixpath.normpath(path[2:]).lstrip("/")
    return "/" + posixpath.normpath(path).lstrip("/")


def in_system(path: str) -> Optional[str]:
    """What /dev, /proc or /sys is, when the absolute `path` (as the kernel reads it) is in one."""
    return SYSTEM.get(known_hosts_path(path).split("/")[1])


def config_files(words: List[str]) -> List[str]:
    """The ssh config files the words give ssh (`-F FILE`)."""
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-F"]


def as_read(path: str) -> str:
    """A known_hosts file as ssh reads it: ~/ this user's home, named as the kernel reads it."""
    return path if path == "none" else known_hosts_path(os.path.expanduser(path))


def spec_named(words: List[str]) -> Dict[str, List[str]]:
    """The known_hosts files the spec's `options:` name (`-o UserKnownHostsFile=...`), by key,
    as ssh reads them (as_read)."""
    named: Dict[str, List[str]] = {k: [] for k in KNOWN_HOSTS}
    for word in words:
        key, eq, value = word.partition("=")
        if eq and key.lower() in KNOWN_HOSTS:
            named[key.lower()] += [as_read(f) for f in value.split()]
    return named


def ssh_g(words: List[str], target: str) -> Dict[str, str]:
    """What ssh will use for `target` with these words (`ssh WORDS -G -- TARGET`: connects nowhere),
    each key's first line. Raises SshSaid with ssh's words when it cannot read its options."""
    import subprocess  # here only: compile imports this module for the names' rule alone

    try:
        got = subprocess.run(
            ["ssh", *words, "-G", "--", target],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=G_SECONDS,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SshSaid("ssh -G: %s" % exc) from None
    if got.returncode != 0:
        raise SshSaid(got.stderr.strip() or "ssh -G exited %d" % got.returncode)
    conf: Dict[str, str] = {}
    for line in got.stdout.splitlines():
        key, _, value = line.partition(" ")
        conf.setdefault(key.lower(), value)
    return conf


def _who(host: str, key: str, path: str, named: bool) -> str:
    """`hosts.H: Key PATH`, with where ssh took it from when the spec's options do not name it."""
    return "hosts.%s: %s %s%s" % (
        host,
        SPELLED[key],
        path,
        "" if named else " (what ssh -G says it reads for %s)" % host,
    )


def _could_be_made(path: str) -> Optional[str]:
    """Why another user could make the missing file `path` (its nearest existing directory is
    writable by others, sticky or not), or None."""
    directory = os.path.dirname(path)
    while directory != "/" and not os.path.lexists(directory):
        directory = os.path.dirname(directory)
    st = os.stat(directory)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        return "directory %s is owned by %s, mode %04o: another user can make %s there" % (
            directory,
            owners.owner(st),
            mode,
            path[len(directory) :].lstrip("/").split("/")[0],
        )
    return None


def judge_file(host: str, key: str, path: str, *, named: bool, records: bool) -> None:
    """One known_hosts file ssh reads for `host` (`key`: which option; `named`: the spec's options
    name it; `records`: accept-new records a new key in it), refused by raising Refused."""
    who = _who(host, key, path, named)
    me = owners.user_name(os.geteuid())
    fix = (
        "make it %s's (or root's) and not writable by others, in folders no one else can write" % me
    )
    if os.path.lexists(path):
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise Refused(
                "%s is not a regular file here (ssh reads and records %s's host key in "
                "it): name a known_hosts file" % (who, host)
            )
        why = private.why_not_private_file(path)
        if why:
            raise Refused(
                "refusing %s %s of hosts.%s: %s; another user could decide which host "
                "keys this machine trusts: %s" % (SPELLED[key], path, host, why, fix)
            )
        return
    folder = os.path.dirname(path) or "/"
    if records:
        if private.why_not_private(folder) is None:
            return
        fix = (
            "chown %d %s; chmod go-w %s" % (os.geteuid(), folder, folder)
            if os.path.isdir(folder)
            else "mkdir -m 700 %s" % folder
        )
        raise Refused(
            "%s does not exist and ssh cannot make it there (%s must be a folder of "
            "this user that no one else can write): with host_keys: accept-new ssh "
            "would take any key of %s, a changed one too, on every connection. Make it "
            "one (%s), or name a known_hosts file that exists" % (who, folder, host, fix)
        )
    if named:
        raise Refused(
            "%s does not exist here: ssh would know no host key of %s from it. Create it "
            "with %s's key (ssh-keyscan, checked against the host's own), or set "
            "hosts.%s.host_keys: accept-new for a first contact, or name the file that "
            "holds the key" % (who, host, host, host)
        )
    found = private.first_not_private(path, os.geteuid())
    why = found[1] if found else _could_be_made(path)
    if why:
        raise Refused(
            "refusing %s %s of hosts.%s: it does not exist yet, and %s; another user "
            "could put host keys there that this machine would trust: %s"
            % (SPELLED[key], path, host, why, fix)
        )


def judge(host: str, target: str, words: List[str]) -> None:
    """Every file ssh would read for `host` with `words`, in the order ssh reads them: the config
    file(s), then (from ssh -G) the host-key checking and each known_hosts file. Raises Refused,
    or SshSaid with ssh's words when ssh -G fails."""
    me = owners.user_name(os.geteuid())
    for conf in config_files(words):
        why = private.why_not_private_file(conf)
        if why:
            raise Refused(
                "refusing hosts.%s.ssh_config %s: %s; another user could replace what "
                "is run or written there: make it %s's and not writable by others, in "
                "folders no one else can write" % (host, os.path.realpath(conf), why, me)
            )
    conf = ssh_g(words, target)
    checking = conf.get("stricthostkeychecking", "")
    if checking not in ("true", "yes", "accept-new"):
        raise Refused(
            "hosts.%s: ssh would check no host key of %s (StrictHostKeyChecking %s, "
            "what ssh -G says): set host_keys: strict or accept-new, and take any "
            "StrictHostKeyChecking out of its ssh_config" % (host, host, checking or "?")
        )
    named = spec_named(words)
    for key in KNOWN_HOSTS:
        for rank, path in enumerate(as_read(f) for f in conf.get(key, "").split()):
            is_named = path in named[key]
            if path in OFF:
                if key == "globalknownhostsfile":
                    continue  # this machine's global file is not read: fewer keys known
                raise Refused(
                    "%s turns host key checking off (no host key is ever known: with "
                    "host_keys: accept-new ssh takes any key of %s, a changed one too): "
                    "name a known_hosts file" % (_who(host, key, path, is_named), host)
                )
            what = in_system(path)
            if what:
                raise Refused(
                    "%s is in /%s, %s, not a known_hosts file: name a regular file that "
                    "holds the host's key"
                    % (_who(host, key, path, is_named), path.split("/")[1], what)
                )
            # accept-new records a new key in the first user file
            records = key == "userknownhostsfile" and rank == 0 and checking == "accept-new"
            try:
                judge_file(host, key, path, named=is_named, records=records)
            except OSError as exc:
                raise Refused(
                    "%s cannot be checked here: %s"
                    % (_who(host, key, path, is_named), exc.strerror or exc)
                ) from None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rbrules.sshfiles",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", required=True, help="the host's name in the spec")
    parser.add_argument("--target", required=True, help="USER@HOST as ssh is given it")
    parser.add_argument("words", nargs="*", help="the host's ssh options (after --)")
    args = parser.parse_args(argv)
    try:
        judge(args.host, args.target, args.words)
    except Refused as exc:
        sys.stderr.write("%s\n" % exc)
        return 2
    except SshSaid as exc:
        sys.stderr.write("%s\n" % exc)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
