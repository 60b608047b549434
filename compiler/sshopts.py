"""The ssh options a spec may set in a host's `options:`: an allowlist (issue #15 M1).

Every option here is what a relay legitimately tunes (keepalives, algorithms, the address family,
known-hosts files, logging), each with a check of its value. Everything else is refused: an option
the runbook sets itself or the spec has its own key for (`port:`, `jump:`, `host_keys:`, ...), one
that runs code or commands on this machine (PKCS11Provider, ProxyCommand, KnownHostsCommand, ...),
one that turns host key checking off (UserKnownHostsFile=/dev/null), one that hands this machine's
agent, credentials, display or ports to the remote (ForwardAgent, LocalForward, ...), config
directives (Include, Match), and any name not listed (ssh has dozens; what is not needed is not
allowed). ssh reads option names without case; so does this check.

Known-hosts files (issue 33 N5) are compared as the kernel reads them, not as written: `/dev/./null`
and `//dev/null` are /dev/null. UserKnownHostsFile may not be /dev/null or `none` (no key is ever
known: strict checking fails every connection, accept-new takes any key, a changed one too);
GlobalKnownHostsFile may (this machine's /etc/ssh/ssh_known_hosts is then not read, which only
knows fewer keys). No file in /dev, /proc or /sys, no ssh % tokens; and the runbook checks, before
it connects, that each file is a regular file, or with accept-new that the first user file can be
made in a private folder, and that no other user can change it, judging what `ssh -G` says ssh
reads for the host (rbrules.sshfiles, which holds the names' rule both sides use): ssh takes a key
it cannot record without a word.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

from rbrules.sshfiles import KNOWN_HOSTS, OFF, in_system, known_hosts_path  # noqa: F401

YES_NO = ("yes", "no")
ALGORITHMS = re.compile(r"^[+^-]?[A-Za-z0-9@._-]+(,[A-Za-z0-9@._-]+)*$")
COUNT = re.compile(r"^[0-9]{1,6}$")
HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$|^[0-9A-Fa-f:.]{2,45}$")
WORD = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
IPQOS = re.compile(r"^[a-z0-9]{1,12}( [a-z0-9]{1,12})?$")
REKEY = re.compile(r"^(default|[0-9]{1,12}[KMG]?)( (none|[0-9]{1,9}[smhdw]?))?$")
PATH = re.compile(r"^(/|~/)[A-Za-z0-9._/%@+=,:-]*$")

Check = Callable[[str], Optional[str]]  # the value -> why it is refused, or None


def _choice(*allowed: str) -> Check:
    return lambda v: None if v in allowed else f"must be one of {', '.join(allowed)}"


def _match(pattern: re.Pattern, what: str) -> Check:
    return lambda v: None if pattern.match(v) else f"must be {what}"


def known_hosts_files(value: str) -> str:
    """The value of UserKnownHostsFile/GlobalKnownHostsFile with each file named as the kernel
    reads it (what the runbook passes to ssh and checks before it connects)."""
    return " ".join(f if f in OFF else known_hosts_path(f) for f in value.split(" "))


def _paths(value: str, *, may_be_off: bool) -> Optional[str]:
    files = value.split(" ")
    for given in files:
        if given in OFF:
            continue
        if "%" in given:
            return (
                f"{given}: ssh's % tokens are not taken here (the runbook checks the file before "
                "ssh reads it): write ~/ for your home, and name one file for every host"
            )
        if not PATH.match(given) or ".." in given.split("/"):
            where = (
                " (ssh would read it from wherever the runbook runs)"
                if PATH.match("/" + given) and ".." not in given.split("/")
                else ""
            )
            return (
                f"{given} must be an absolute path or a ~/ path{where}, e.g. ~/.ssh/known_hosts; "
                "several files are separated by single spaces, without `..`"
            )
    normal = [given if given in OFF else known_hosts_path(given) for given in files]
    if not may_be_off and any(given in OFF for given in normal):
        shown = next(
            given if given == normal_name else f"{given} is /dev/null: it"
            for given, normal_name in zip(files, normal)
            if normal_name in OFF
        )
        return (
            f"{shown} turns host key checking off (no host key is ever known: with accept-new "
            "any key is taken): name a known_hosts file, or leave the option out"
        )
    for given, normal_name in zip(files, normal):
        if normal_name in OFF:
            continue  # GlobalKnownHostsFile /dev/null: this machine's global file is not read
        what = in_system(normal_name) if normal_name.startswith("/") else None
        if what:
            top = normal_name.split("/")[1]
            return (
                f"{given} is in /{top}, {what}, not a known_hosts file: name a regular file "
                "that holds the host's key (e.g. /etc/ssh/ssh_known_hosts or "
                "~/.ssh/known_hosts), or leave the option out"
            )
    return None


def config_problem(value: str) -> Optional[str]:
    """Why `value` is refused as a host's `ssh_config:` (the file given to ssh as -F), or None. An
    absolute or ~/ path is read as written; a relative one is taken from the folder of the spec
    file that writes it (config_from) and reached from the runbook's own folder when it runs
    (compile writes the way there: resolve.ssh_config_word). The runbook checks the file again
    before ssh reads it (runtime/ssh_config.sh.j2): a regular file that only this user or root can
    change, nor any directory above it, since ssh runs the commands it names (ProxyCommand, Match
    exec) here.

    `..` climbs out of the spec's folder, so a relative path may start with it (`../ssh/config`
    beside specs/); anywhere else it is refused: after a name it only undoes that name, or, when
    the name is a link, goes somewhere the path does not show; in an absolute or ~/ path the
    folder it means can be written directly."""
    if "%" in value:
        return (
            f"{value}: ssh's % tokens are not taken here (the runbook checks the file before ssh "
            "reads it): write ~/ for your home"
        )
    parts = value.split("/")
    if value.startswith(("/", "~/")):
        if not PATH.match(value) or ".." in parts or value.endswith("/"):
            return (
                f"{value} must name a file without `..` (write the folder it means), e.g. "
                f"~/.ssh/config or /etc/rb/ssh_config; {RELATIVE}"
            )
        return config_in_system(value) if value.startswith("/") else None
    names = [p for p in parts if p not in ("", ".")]
    climb = next((i for i, p in enumerate(names) if p != ".."), len(names))
    if not RELATIVE_PATH.match(value) or value.endswith("/") or climb == len(names):
        return (
            f"{value} must be a path to a file: absolute, ~/ or relative, e.g. ~/.ssh/config, "
            f"/etc/rb/ssh_config or ssh/config; {RELATIVE}"
        )
    if ".." in names[climb:]:
        return (
            f"{value}: `..` only at the start of a relative path, where it climbs out of the "
            "spec's folder; after a name it undoes that name (or, through a link, goes "
            f"elsewhere): write the path without it; {RELATIVE}"
        )
    return None


# what a relative ssh_config is taken from, for the errors that refuse one
RELATIVE = (
    "a relative path is taken from the folder of the spec file that writes it (ssh/config "
    "in specs/x.yaml is specs/ssh/config) and found from the runbook's folder when it runs"
)
RELATIVE_PATH = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._/@+=,:-]*$")


def config_in_system(path: str) -> Optional[str]:
    """Why the absolute `path` cannot be an ssh config file (in /dev, /proc or /sys), or None."""
    what = in_system(path)
    if what:
        top = known_hosts_path(path).split("/")[1]
        return (
            f"{path} is in /{top}, {what}, not an ssh config file: name the file that "
            "defines the host (Host blocks, as ssh -F reads them)"
        )
    return None


def config_from(folder: str, value: str) -> Optional[str]:
    """The absolute path the relative ssh_config `value` names from `folder` (an absolute path, the
    spec file's folder with its links resolved), or None when its `..` climb above `/`."""
    names = [p for p in value.split("/") if p not in ("", ".")]
    climb = next((i for i, p in enumerate(names) if p != ".."), len(names))
    above = [p for p in folder.split("/") if p]
    if climb > len(above):
        return None
    return "/" + "/".join(above[: len(above) - climb] + names[climb:])


ALLOWED: dict[str, Check] = {
    "AddressFamily": _choice("any", "inet", "inet6"),
    "BindAddress": _match(HOST, "an address of this machine"),
    "BindInterface": _match(WORD, "a network interface name"),
    "CASignatureAlgorithms": _match(ALGORITHMS, "a comma-separated list of algorithms"),
    "CertificateFile": lambda v: (
        None
        if PATH.match(v) and ".." not in v.split("/")
        else "must be an absolute path or start with ~/"
    ),
    "CheckHostIP": _choice(*YES_NO),
    "Compression": _choice(*YES_NO),
    "ConnectionAttempts": _match(COUNT, "a number"),
    "GlobalKnownHostsFile": lambda v: _paths(v, may_be_off=True),
    "GSSAPIAuthentication": _choice(*YES_NO),
    "HashKnownHosts": _choice(*YES_NO),
    "HostKeyAlgorithms": _match(ALGORITHMS, "a comma-separated list of algorithms"),
    "HostKeyAlias": _match(HOST, "a host name"),
    "IdentitiesOnly": _choice(*YES_NO),
    "IPQoS": _match(IPQOS, "one or two DSCP classes, e.g. throughput or af21 cs1"),
    "KexAlgorithms": _match(ALGORITHMS, "a comma-separated list of algorithms"),
    "LogLevel": _choice(
        "QUIET", "FATAL", "ERROR", "INFO", "VERBOSE", "DEBUG", "DEBUG1", "DEBUG2", "DEBUG3"
    ),
    "MACs": _match(ALGORITHMS, "a comma-separated list of algorithms"),
    "PreferredAuthentications": _match(ALGORITHMS, "a comma-separated list of methods"),
    "PubkeyAcceptedAlgorithms": _match(ALGORITHMS, "a comma-separated list of algorithms"),
    "PubkeyAcceptedKeyTypes": _match(ALGORITHMS, "a comma-separated list of algorithms"),
    "PubkeyAuthentication": _choice("yes", "no", "unbound", "host-bound"),
    "RekeyLimit": _match(REKEY, "a size and an optional time, e.g. 1G 1h"),
    "ServerAliveCountMax": _match(COUNT, "a number"),
    "ServerAliveInterval": _match(COUNT, "a number of seconds"),
    "TCPKeepAlive": _choice(*YES_NO),
    "UserKnownHostsFile": lambda v: _paths(v, may_be_off=False),
}

_RUNS_HERE = "runs a command on this machine"
_LOADS_HERE = "loads a library into ssh on this machine (runs its code here)"
_MUX = "the runbook multiplexes its connections itself"
REFUSED: dict[str, str] = {
    # the runbook sets these, or the spec has its own key for them
    "batchmode": "the runbook always runs ssh with BatchMode=yes",
    "stricthostkeychecking": "use `host_keys: strict` (yes) or `host_keys: accept-new`; checking "
    "is never turned off",
    "connecttimeout": "use `connect_timeout:`",
    "port": "use `port:`",
    "identityfile": "use `identity_file:`",
    "proxyjump": "use `jump:` (a list of hosts, checked)",
    "user": "write it in `ssh: user@host`",
    "hostname": "write it in `ssh: user@host`",
    "ciphers": "the runbook chooses the ciphers (ssh -c, AES-GCM first), which would override it",
    "controlmaster": _MUX,
    "controlpath": _MUX,
    "controlpersist": _MUX,
    "remotecommand": "the runbook decides what runs remotely",
    "requesttty": "the runbook decides what runs remotely",
    "sessiontype": "the runbook decides what runs remotely",
    # code or commands on this machine
    "proxycommand": f"use `jump:` (ProxyJump); a ProxyCommand {_RUNS_HERE}",
    "localcommand": _RUNS_HERE,
    "permitlocalcommand": f"lets LocalCommand run: it {_RUNS_HERE}",
    "knownhostscommand": _RUNS_HERE,
    "pkcs11provider": _LOADS_HERE,
    "securitykeyprovider": _LOADS_HERE,
    "xauthlocation": f"names a program ssh runs on this machine (xauth): it {_RUNS_HERE}",
    "include": "a config file directive, which ssh refuses on its command line (the file it "
    "names would be read unchecked)",
    "match": "a config file directive, which ssh refuses on its command line (`Match exec` runs a "
    "command on this machine)",
    "host": "a config file directive, which ssh refuses on its command line; options here apply "
    "to this host already",
    # what this machine hands to the remote
    "forwardagent": "hands this machine's ssh agent to the remote host: anyone root there can "
    "log in elsewhere with your keys",
    "forwardx11": "opens this machine's X display to the remote host",
    "forwardx11trusted": "opens this machine's X display to the remote host",
    "gssapidelegatecredentials": "hands your Kerberos credentials to the remote host",
    "localforward": "opens a tunnel between the two machines; the runbook needs none",
    "remoteforward": "opens a tunnel between the two machines; the runbook needs none",
    "dynamicforward": "opens a tunnel between the two machines; the runbook needs none",
    "gatewayports": "opens forwarded ports to other machines",
    "tunnel": "opens a tunnel device between the two machines; the runbook needs none",
    "tunneldevice": "opens a tunnel device between the two machines; the runbook needs none",
    "sendenv": "sends this machine's environment variables to the remote host",
    "setenv": "sets environment variables for the runbook's remote commands",
}
_BY_LOWER = {name.lower(): name for name in ALLOWED}


def allowed_list() -> str:
    return ", ".join(sorted(ALLOWED, key=str.lower))


def key_problem(key: str) -> Optional[str]:
    """Why option `key` may not be set in `options:`, or None when it may."""
    if key.lower() in _BY_LOWER:
        return None
    why = REFUSED.get(key.lower())
    if why:
        return f"{key} cannot be set in options: {why} (allowed: {allowed_list()})"
    import difflib  # only a mistake needs it

    near = difflib.get_close_matches(key.lower(), list(_BY_LOWER), n=1, cutoff=0.75)
    hint = f"; did you mean {_BY_LOWER[near[0]]!r}?" if near else ""
    return f"{key} is not among the ssh options a spec may set{hint} (allowed: {allowed_list()})"


def value_problem(key: str, value: str) -> Optional[str]:
    """Why `value` is refused for the allowed option `key`, or None."""
    return ALLOWED[_BY_LOWER[key.lower()]](value)
