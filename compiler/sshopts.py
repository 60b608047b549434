"""The ssh options a spec may set in a host's `options:`: an allowlist (issue #15 M1).

Every option here is what a relay legitimately tunes (keepalives, algorithms, the address family,
known-hosts files, logging), each with a check of its value. Everything else is refused: an option
the runbook sets itself or the spec has its own key for (`port:`, `jump:`, `host_keys:`, ...), one
that runs code or commands on this machine (PKCS11Provider, ProxyCommand, KnownHostsCommand, ...),
one that turns host key checking off (UserKnownHostsFile=/dev/null), one that hands this machine's
agent, credentials, display or ports to the remote (ForwardAgent, LocalForward, ...), config
directives (Include, Match), and any name not listed (ssh has dozens; what is not needed is not
allowed). ssh reads option names without case; so does this check.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

YES_NO = ("yes", "no")
ALGORITHMS = re.compile(r"^[+^-]?[A-Za-z0-9@._-]+(,[A-Za-z0-9@._-]+)*$")
COUNT = re.compile(r"^[0-9]{1,6}$")
HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$|^[0-9A-Fa-f:.]{2,45}$")
WORD = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
IPQOS = re.compile(r"^[a-z0-9]{1,12}( [a-z0-9]{1,12})?$")
REKEY = re.compile(r"^(default|[0-9]{1,12}[KMG]?)( (none|[0-9]{1,9}[smhdw]?))?$")
PATH = re.compile(r"^(/|~/)[A-Za-z0-9._/%@+=,:-]*$")
OFF = ("/dev/null", "none")

Check = Callable[[str], Optional[str]]  # the value -> why it is refused, or None


def _choice(*allowed: str) -> Check:
    return lambda v: None if v in allowed else f"must be one of {', '.join(allowed)}"


def _match(pattern: re.Pattern, what: str) -> Check:
    return lambda v: None if pattern.match(v) else f"must be {what}"


def _paths(v: str, *, may_be_off: bool) -> Optional[str]:
    files = v.split(" ")
    if not may_be_off and any(f in OFF for f in files):
        return (f"{v} turns host key checking off (no host key is ever known: with accept-new "
                "any key is taken): name a known_hosts file, or leave the option out")
    for f in files:
        if f in OFF and may_be_off:
            continue
        if not PATH.match(f) or ".." in f.split("/"):
            return "must be absolute paths or ~/ paths, separated by single spaces"
    return None


ALLOWED: dict[str, Check] = {
    "AddressFamily": _choice("any", "inet", "inet6"),
    "BindAddress": _match(HOST, "an address of this machine"),
    "BindInterface": _match(WORD, "a network interface name"),
    "CASignatureAlgorithms": _match(ALGORITHMS, "a comma-separated list of algorithms"),
    "CertificateFile": lambda v: None if PATH.match(v) and ".." not in v.split("/")
    else "must be an absolute path or start with ~/",
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
    "LogLevel": _choice("QUIET", "FATAL", "ERROR", "INFO", "VERBOSE", "DEBUG", "DEBUG1", "DEBUG2",
                        "DEBUG3"),
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
    "stricthostkeychecking": "use `host_keys: strict` (yes) or `host_keys: accept-new`; checking is "
                             "never turned off",
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
    return (f"{key} is not among the ssh options a spec may set{hint} (allowed: "
            f"{allowed_list()})")


def value_problem(key: str, value: str) -> Optional[str]:
    """Why `value` is refused for the allowed option `key`, or None."""
    return ALLOWED[_BY_LOWER[key.lower()]](value)
