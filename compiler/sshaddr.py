"""ssh addresses as a spec writes them: `user@host`, `ssh://user@host:2222`, `jump:` chains, and
the names of ssh options; each checked, so that what reaches ssh is an address, never an option."""

# No `from __future__ import annotations` here (see compiler/fields.py).
import re
from typing import Annotated, Optional

from pydantic import AfterValidator

from .fields import _nonempty

USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
IPV6 = re.compile(r"^\[?[0-9A-Fa-f:.]+(?:%[A-Za-z0-9]+)?\]?$")
HOST_PORT = re.compile(r"^(\[[^\]]*\]|[^:\[\]]+):([0-9]+)$")  # host:2222, [::1]:2222
SSH_URI = re.compile(
    r"^ssh://(?:(?P<user>[^@/\[\]]+)@)?(?P<host>\[[^\]/]+\]|[^:/@\[\]]+)"
    r"(?::(?P<port>[^/]*))?/?$"
)
SSH_OPTION = re.compile(r"^[A-Za-z][A-Za-z0-9]{1,40}$")


def parse_ssh_target(value: str) -> tuple[Optional[str], str]:
    """ "user@host" or "host" -> (user, host), each validated; raises ValueError."""
    _nonempty(value)
    user, _, host = value.rpartition("@")
    with_port = HOST_PORT.match(host)
    if with_port:
        raise ValueError(
            f"{value!r}: ssh takes no port in the address: use `port: {with_port.group(2)}` "
            f"(and `ssh: {user + '@' if user else ''}{with_port.group(1).strip('[]')}`)"
        )
    if value.startswith("ssh://"):
        raise ValueError(f"{value!r} is not an ssh address like ssh://user@host:2222")
    if user and not USER.match(user):
        raise ValueError(f"{user!r} is not a valid user name")
    if not (HOSTNAME.match(host) or (":" in host and IPV6.match(host))):
        raise ValueError(f"{host!r} is not a valid host name or address")
    return (user or None), host.strip("[]")


def _ssh_target(value: str) -> str:
    parse_ssh_target(value)
    return value


def parse_ssh_uri(value: str) -> tuple[str, Optional[int]]:
    """ "ssh://user@host:2222" -> ("user@host", 2222), checked; raises ValueError."""
    found = SSH_URI.match(value)
    if not found:
        raise ValueError(f"{value!r} is not an ssh address like ssh://user@host:2222 (no path)")
    user, host, port = found.group("user", "host", "port")
    host = host.strip("[]")  # ssh takes an IPv6 address bare after user@, in brackets in a URI
    target = f"{user}@{host}" if user else host
    parse_ssh_target(target)
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{value!r}: {port!r} is not a port number")
    return target, int(port) if port else None


def _jump(value: str) -> str:
    # user@host[:port], comma-separated chain, as ssh -J takes it ([v6]:port for an IPv6 address);
    # ssh://user@host:port hops are rewritten that way.
    hops = []
    for hop in value.split(","):
        if hop.startswith("ssh://"):
            target, port = parse_ssh_uri(hop)
            user, at, host = target.rpartition("@")
            host = f"[{host}]" if port and ":" in host else host
            hop = f"{user}{at}{host}:{port}" if port else target
        hops.append(hop)
        with_port = HOST_PORT.match(hop.rpartition("@")[2])
        if with_port:
            target, port = hop[: -len(with_port.group(2)) - 1], with_port.group(2)
        else:
            target, _, port = hop.rpartition(":") if hop.count(":") == 1 else (hop, "", "")
        parse_ssh_target(target)
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"{port!r} is not a port number")
    return ",".join(hops)


def _ssh_option_key(value: str) -> str:
    if not SSH_OPTION.match(value):
        raise ValueError(f"{value!r} is not an ssh option name")
    return value


SshTarget = Annotated[str, AfterValidator(_ssh_target)]
Jump = Annotated[str, AfterValidator(_jump)]


def _ssh_config(value: str) -> str:
    from . import sshopts  # the path rules of ssh's own files, with the options' allowlist

    _nonempty(value)
    refused = sshopts.config_problem(value)
    if refused:
        raise ValueError(refused)
    if not value.startswith(("/", "~/")):  # from the spec's folder (resolve.ssh_config_word)
        return "/".join(p for p in value.split("/") if p not in ("", "."))
    return sshopts.known_hosts_path(value)  # named as the kernel reads it, as known_hosts files


SshConfigPath = Annotated[str, AfterValidator(_ssh_config)]
