"""Stage 2: the spec's schema. Pydantic models, extra keys forbidden, every string checked.

Anything that will reach a shell is validated here first, even though rendering quotes it anyway:
the runbook runs as root on expensive machines, so a hostile or mistyped value is refused with a
message that points at the spec, rather than quoted and carried along.
"""

# No `from __future__ import annotations` here: pydantic would then eval() every field's
# annotation string when it builds the models at import (~2 ms of each compile).
import posixpath
import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

IDENT = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
IPV6 = re.compile(r"^\[?[0-9A-Fa-f:.]+(?:%[A-Za-z0-9]+)?\]?$")
HOST_PORT = re.compile(r"^(\[[^\]]*\]|[^:\[\]]+):([0-9]+)$")  # host:2222, [::1]:2222
SSH_URI = re.compile(r"^ssh://(?:(?P<user>[^@/\[\]]+)@)?(?P<host>\[[^\]/]+\]|[^:/@\[\]]+)"
                     r"(?::(?P<port>[^/]*))?/?$")
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
SSH_OPTION = re.compile(r"^[A-Za-z][A-Za-z0-9]{1,40}$")
VERSION = re.compile(r"^[0-9]+(\.[0-9]+){0,3}([a-z0-9.+-]*)$")
CAPABILITY = re.compile(r"^[0-9]{1,2}\.[0-9]$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

class At(ValueError):
    """A validator's error that belongs to an entry below the value it checks: `at` is the path
    from that value (`("success",)` from a check of the whole `fanout:`), so validate.py points the
    message at that entry (at its key with `key=True`). Several: `At.many([(at, message, key)])`."""

    def __init__(self, at: tuple, message: str, key: bool = False):
        super().__init__(message)
        self.errors: list[tuple[tuple, str, bool]] = [(tuple(at), message, key)]

    @classmethod
    def many(cls, errors: list[tuple[tuple, str, bool]]) -> "At":
        first = cls(*errors[0])
        first.errors = [(tuple(at), message, key) for at, message, key in errors]
        return first


def _empty_list() -> list:
    return []


def _empty_dict() -> dict:
    return {}


# Field(default_factory=_empty_list), not default_factory=list: pydantic inspects the factory's
# signature, and a builtin's is parsed from text with the tokenizer (~2 ms of each compile).


class Model(BaseModel):
    # defer_build: a model's validator is built when it is first used, not at import. A compile
    # validates with Spec's alone (which holds every model's schema), so the 18 per-model
    # validators and serializers are never built.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)


SECRET = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----|PuTTY-User-Key-File|\bsshpass\b")


def _no_secret(value: str) -> str:
    if SECRET.search(value):
        raise ValueError(
            "looks like a private key or password: specs are committed and runbooks are reviewed in "
            "PRs, so keep secrets out (use identity_file: with a path, an ssh agent, or ssh config)")
    return value


def _text(value: str) -> str:
    """One-line free text (descriptions): no control characters."""
    _no_secret(value)
    if CONTROL.search(value.replace("\t", " ")):
        raise ValueError("must be one line of text without control characters")
    return value


def _nonempty(value: str) -> str:
    _no_secret(value)
    if not value.strip():
        raise ValueError("must not be empty")
    if CONTROL.search(value):
        raise ValueError("must not contain control characters (newline, tab, NUL, ...)")
    return value


def _abs_path(value: str) -> str:
    _nonempty(value)
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path (starting with /), got {value!r}")
    return _clean_path(value)


def _path(value: str) -> str:
    """An absolute path, or a relative one (only where the spec allows it)."""
    _nonempty(value)
    return _clean_path(value)


def _clean_path(value: str) -> str:
    parts = value.split("/")
    if ".." in parts:
        raise ValueError("must not contain '..' components")
    if value.startswith("-"):
        raise ValueError("must not start with '-'")
    norm = posixpath.normpath(value)
    if norm in ("/", "."):
        raise ValueError("must name a directory below / (not / itself)")
    return norm


def _identity_path(value: str) -> str:
    _nonempty(value)
    if value.startswith("~/"):
        _clean_path(value[2:])
        return "~/" + posixpath.normpath(value[2:])
    if not value.startswith("/"):
        raise ValueError("must be an absolute path or start with ~/")
    return _clean_path(value)


def _exclude(value: str) -> str:
    _nonempty(value)
    if value.startswith("-"):
        raise ValueError("must not start with '-'")
    return value


def _ident(value: str) -> str:
    if not IDENT.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: use lower-case letters, digits and _ (start with a letter)"
        )
    return value


def _name(value: str) -> str:
    if not NAME.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: lower-case letters, digits, '.', '_', '-' (max 63)"
        )
    return value


def _module(value: str) -> str:
    if not MODULE.match(value):
        raise ValueError(f"{value!r} is not a Python module name")
    return value


def _version(value: str) -> str:
    if not VERSION.match(value):
        raise ValueError(f"{value!r} is not a version like \"13.0\" or \"2.11.0\"")
    return value


def _capability(value: str) -> str:
    if not CAPABILITY.match(value):
        raise ValueError(f"{value!r} is not a compute capability like \"10.3\"")
    return value


Text = Annotated[str, AfterValidator(_text)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
IdentityPath = Annotated[str, AfterValidator(_identity_path)]
Exclude = Annotated[str, AfterValidator(_exclude)]
Ident = Annotated[str, AfterValidator(_ident)]
Name = Annotated[str, AfterValidator(_name)]
ModuleName = Annotated[str, AfterValidator(_module)]
Version = Annotated[str, AfterValidator(_version)]
Capability = Annotated[str, AfterValidator(_capability)]
NonEmpty = Annotated[str, AfterValidator(_nonempty)]
Port = Annotated[int, Field(strict=True, ge=1, le=65535)]


def parse_ssh_target(value: str) -> tuple[Optional[str], str]:
    """"user@host" or "host" -> (user, host), each validated; raises ValueError."""
    _nonempty(value)
    user, _, host = value.rpartition("@")
    with_port = HOST_PORT.match(host)
    if with_port:
        raise ValueError(
            f"{value!r}: ssh takes no port in the address: use `port: {with_port.group(2)}` "
            f"(and `ssh: {user + '@' if user else ''}{with_port.group(1).strip('[]')}`)")
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
    """"ssh://user@host:2222" -> ("user@host", 2222), checked; raises ValueError."""
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
            target, port = hop[:-len(with_port.group(2)) - 1], with_port.group(2)
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


class Host(Model):
    """One machine the runbook touches: reached over ssh, or this machine itself (`local: true`)."""

    ssh: Optional[SshTarget] = None
    local: StrictBool = False
    port: Optional[Port] = None
    identity_file: Optional[IdentityPath] = None
    jump: Optional[Jump] = None
    host_keys: Literal["strict", "accept-new"] = "strict"
    connect_timeout: Annotated[int, Field(strict=True, ge=1, le=300)] = 10
    # only the ssh options a relay needs (compiler/sshopts.py: an allowlist, values checked)
    options: dict[Annotated[str, AfterValidator(_ssh_option_key)], NonEmpty] = Field(
        default_factory=_empty_dict)

    @field_validator("options")
    @classmethod
    def _allowed_options(cls, options: dict[str, str]) -> dict[str, str]:
        from . import sshopts  # the allowlist: loaded by the specs that set options only

        errors = []
        for key, value in options.items():
            refused = sshopts.key_problem(key)
            if refused:
                errors.append(((key,), refused, True))  # at the option's name
                continue
            bad_value = sshopts.value_problem(key, value)
            if bad_value:
                errors.append(((key,), bad_value, False))
        if errors:
            raise At.many(errors)
        # known_hosts files as the kernel reads them: what ssh gets and the runbook checks
        return {key: sshopts.known_hosts_files(value) if key.lower() in sshopts.KNOWN_HOSTS
                else value for key, value in options.items()}

    @model_validator(mode="before")
    @classmethod
    def _ssh_uri(cls, data: Any) -> Any:
        """`ssh: ssh://user@host:2222` is read as `ssh: user@host` with `port: 2222`."""
        if not isinstance(data, dict) or not isinstance(data.get("ssh"), str) \
                or not data["ssh"].startswith("ssh://"):
            return data
        try:
            target, port = parse_ssh_uri(data["ssh"])
        except ValueError as exc:
            raise At(("ssh",), str(exc)) from None
        if port is not None and data.get("port") not in (None, port):
            raise At(("port",), f"{data['port']} differs from the port in ssh: {data['ssh']}")
        return {**data, "ssh": target, **({"port": port} if port is not None else {})}

    @model_validator(mode="after")
    def _one_kind(self) -> "Host":
        if self.local and self.ssh:
            raise ValueError("a host is either `local: true` or reached by `ssh:`, not both")
        if not self.local and not self.ssh:
            raise ValueError("say how to reach the host: `ssh: user@host`, or `local: true`")
        if self.local and (self.port or self.identity_file or self.jump or self.options):
            raise ValueError("ssh settings (port, identity_file, jump, options) need `ssh:`")
        return self


def parse_endpoint(value: str) -> tuple[str, str]:
    """'host:/path' -> (host, path); the host is checked against `hosts:` later."""
    host, sep, path = value.partition(":")
    if not sep or not host:
        raise ValueError(f"{value!r} must be HOST:PATH, e.g. b300:/opt/sglang/.venv")
    return host, path


def _endpoint(value: str) -> str:
    host, path = parse_endpoint(value)
    _ident(host)
    _path(path)
    return value


EndpointText = Annotated[str, AfterValidator(_endpoint)]


def _env_name(value: str) -> str:
    if not ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not an environment variable name")
    return value


class Transfer(Model):
    from_: EndpointText = Field(alias="from")
    to: EndpointText
    route: Literal["relay", "direct", "auto"] = "relay"
    compression: Literal["auto", "zstd", "lz4", "gzip", "none"] = "auto"
    exclude: list[Exclude] = Field(default_factory=_empty_list)
    verify: Literal["sha256", "blake2b", "none"] = "sha256"
    on_existing: Literal["refuse", "backup", "replace"] = "refuse"
    # re-run check: quick compares path/size/mode/mtime on both ends (like rsync); digest re-hashes
    rerun: Literal["quick", "digest"] = "quick"
    # the cores the kit may use on each host (None: one per CPU): hashing threads, and where the
    # sending end starts the receiving ends (both on one host, route direct) one stream per two
    jobs: Optional[Annotated[int, Field(strict=True, ge=1, le=256)]] = None
    # route direct/auto: how the source host reaches the destination with its own ssh setup
    # (default: the destination's `ssh:` and `port:`; keys and known_hosts are the source's own).
    direct: Optional[Host] = None
    # Hostile source and host (docs/design.md, "Threat model"); the kit's side is rbkit.hostfs.
    # Entries with setuid, setgid, sticky or world-write bits: refused in preflight (moved by root,
    # a setuid file of another user would arrive setuid-root), installed without them, or kept.
    special_modes: Literal["refuse", "strip", "keep"] = "refuse"
    # Symlinks that leave the tree (the venv's bin/python* excepted): refused, or moved as they are.
    outside_links: Literal["refuse", "keep"] = "refuse"
    # Backups (on_existing: backup) kept after a successful swap; older ones are removed.
    keep_backups: Annotated[int, Field(strict=True, ge=1, le=100)] = 2
    # A file system that cannot swap in one rename (no RENAME_EXCHANGE, e.g. NFS): refuse, or swap
    # with two renames journaled beside the destination (finished or undone by the next run).
    swap_atomic: Literal["require", "allow"] = "allow"
    # A destination whose parent (or a directory above it) another user can write: the lock, the
    # staging, the backups and the env file live there, so it is refused in preflight; allow: a
    # warning naming it, and the run goes on (the checks still source the install's own env file).
    shared_parent: Literal["refuse", "allow"] = "refuse"

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True,
                              defer_build=True)

    @property
    def source(self) -> tuple[str, str]:
        host, path = parse_endpoint(self.from_)
        return host, _path(path)

    @property
    def target(self) -> tuple[str, str]:
        host, path = parse_endpoint(self.to)
        return host, _path(path)


class Cuda(Model):
    version: Version
    home: AbsPath
    library_path_first: list[NonEmpty] = Field(default_factory=_empty_list)
    env_file: Optional[AbsPath] = None

    @model_validator(mode="after")
    def _relative_dirs(self) -> "Cuda":
        for i, d in enumerate(self.library_path_first):
            if d.startswith("/") or ".." in d.split("/") or d.startswith("-"):
                raise ValueError(
                    f"library_path_first[{i}]: {d!r} must be relative to the venv's site-packages"
                )
        return self


def _gpu_model(value: str) -> str:
    # as people write it or nvidia-smi prints it: "B300", "NVIDIA H100 80GB HBM3" (catalog.lookup)
    if not re.match(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]| (?! )){0,79}(?<! )$", value):
        raise ValueError(f"{value!r} is not a GPU model name like B300 or \"NVIDIA H100 80GB HBM3\"")
    return value


class Gpu(Model):
    model: Annotated[str, AfterValidator(_gpu_model)]
    count: Annotated[int, Field(strict=True, ge=1, le=64)] = 1
    capability: Optional[Capability] = None
    # the audit of every kernel library in the venv for this GPU's arch: before anything moves (on
    # the source) and again after the swap; `false` turns it off, and says so in --plan
    kernel_audit: StrictBool = True


class CheckBase(Model):
    allow_skip: StrictBool = False


class TorchCheck(CheckBase):
    version: Optional[Version] = None
    cuda: Optional[Version] = None


class DevicesCheck(CheckBase):
    count: Optional[Annotated[int, Field(strict=True, ge=0, le=64)]] = None
    capability: Optional[Capability] = None
    names: Optional[list[NonEmpty]] = None


class MatmulCheck(CheckBase):
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    size: Annotated[int, Field(strict=True, ge=16, le=32768)] = 4096
    every_device: StrictBool = True


class KernelAuditCheck(CheckBase):
    arch: Optional[Annotated[str, Field(pattern=r"^sm_[0-9]{2,3}[af]?$")]] = None
    paths: Optional[list[NonEmpty]] = None
    # files whose vendor dispatches per arch by design, where a unit without the target is a note
    # (absent: NVIDIA's own libraries, nvidia/*); strict: every unit counts
    partial_ok: Optional[list[NonEmpty]] = None
    strict: StrictBool = False


class RelocationCheck(CheckBase):
    """Always run (the plan adds it): bin/ interpreters inside the venv, no old prefix left."""
    old: Optional[AbsPath] = None
    timeout_s: Annotated[int, Field(strict=True, ge=1, le=3600)] = 60


class OutsideCheck(CheckBase):
    """References that leave the venv: editable installs, .pth paths, links out of the tree."""


class LibrariesCheck(CheckBase):
    expect_dirs: list[AbsPath] = Field(default_factory=_empty_list)


class NcclCheck(CheckBase):
    pass


Snippet = Annotated[str, Field(min_length=1, max_length=20000), AfterValidator(_no_secret)]


class PythonCheck(CheckBase):
    name: Optional[Text] = None
    code: Snippet


class CommandCheck(CheckBase):
    name: Optional[Text] = None
    run: Snippet
    expect_exit: Annotated[int, Field(strict=True, ge=0, le=255)] = 0
    timeout_s: Annotated[int, Field(strict=True, ge=1, le=3600)] = 300


CHECK_TYPES: dict[str, Any] = {
    "torch": TorchCheck,
    "devices": DevicesCheck,
    "matmul": MatmulCheck,
    "imports": list[ModuleName],
    "kernel_audit": KernelAuditCheck,
    "libraries": LibrariesCheck,
    "nccl": NcclCheck,
    "python": PythonCheck,
    "command": CommandCheck,
    "relocation": RelocationCheck,
    "outside": OutsideCheck,
}


class Check(Model):
    """One list item of `checks:`, a mapping with exactly one key naming the check type."""

    torch: Optional[TorchCheck] = None
    devices: Optional[DevicesCheck] = None
    matmul: Optional[MatmulCheck] = None
    imports: Optional[Annotated[list[ModuleName], Field(min_length=1)]] = None
    kernel_audit: Optional[KernelAuditCheck] = None
    libraries: Optional[LibrariesCheck] = None
    nccl: Optional[NcclCheck] = None
    python: Optional[PythonCheck] = None
    command: Optional[CommandCheck] = None
    relocation: Optional[RelocationCheck] = None
    outside: Optional[OutsideCheck] = None

    @model_validator(mode="before")
    @classmethod
    def _empty_means_defaults(cls, data: Any) -> Any:
        # `- devices: {}` and `- nccl:` (null) both mean "with defaults".
        if isinstance(data, dict):
            return {k: ({} if v is None and k != "imports" else v) for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> "Check":
        given = [k for k in CHECK_TYPES if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "each check is a mapping with exactly one of: " + ", ".join(CHECK_TYPES)
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in CHECK_TYPES if getattr(self, k) is not None)

    @property
    def params(self) -> dict[str, Any]:
        value = getattr(self, self.kind)
        if isinstance(value, list):
            return {"modules": list(value)}
        # what model_dump(exclude={"allow_skip"}, exclude_none=True) gives for these flat models
        # (strings, numbers, lists of strings), without building a serializer for each check type
        out = {}
        for name in type(value).model_fields:
            v = getattr(value, name)
            if name != "allow_skip" and v is not None:
                out[name] = list(v) if isinstance(v, list) else v
        return out

    @property
    def allow_skip(self) -> bool:
        value = getattr(self, self.kind)
        return bool(getattr(value, "allow_skip", False))


def _nodeset(value: str) -> str:
    from .fanout import expand  # ClusterShell's NodeSet, with the rest of the fan-out

    expand(value)
    return value


NodeSet = Annotated[str, AfterValidator(_nodeset)]


class Fanout(Model):
    """`fanout:` install on many nodes through the cluster's engine (docs/fanout.md)."""

    nodes: NodeSet
    engine: Literal["slurm", "clush"] = "clush"
    success: Union[Literal["all"], Annotated[int, Field(strict=True, ge=1, le=4096)]] = "all"
    timeout_s: Annotated[int, Field(strict=True, ge=1, le=86400)] = 600
    connect_timeout: Annotated[int, Field(strict=True, ge=1, le=300)] = 10
    scratch: AbsPath = "/tmp"
    width: Optional[Annotated[int, Field(strict=True, ge=1, le=4096)]] = None
    ssh_config: Optional[AbsPath] = None   # clush: ssh -F for every node
    topology: Optional[AbsPath] = None     # clush: tree mode through gateways
    # clush tree mode: the python every gateway runs ClusterShell's gateway with
    # (CLUSTERSHELL_GW_PYTHON_EXECUTABLE); it must import ClusterShell. Default /usr/bin/python3.
    gateway_python: Optional[AbsPath] = None

    @field_validator("success", mode="before")
    @classmethod
    def _success(cls, value: Any) -> Any:
        """One message for both halves of the union (pydantic would give one per member)."""
        if value == "all" or (type(value) is int and 1 <= value <= 4096):
            return value
        quoted = " (a number: write it without quotes)" if isinstance(value, str) \
            and value.isdigit() else ""
        raise ValueError(f'must be "all" or how many nodes must pass (1 to 4096); got '
                         f'{value!r}{quoted}')

    @field_validator("width")
    @classmethod
    def _sbcast_fanout(cls, value: Optional[int], info: ValidationInfo) -> Optional[int]:
        if value is not None and value > 8 and info.data.get("engine") == "slurm":
            raise ValueError(f"{value}: with slurm, width is sbcast's --fanout, at most 8")
        return value

    @model_validator(mode="after")
    def _fits(self) -> "Fanout":
        from .fanout import expand

        count = len(expand(self.nodes))
        if self.success != "all" and self.success > count:
            raise At(("success",), f"{self.success} is more nodes than {self.nodes} has ({count})")
        for key in ("ssh_config", "topology", "gateway_python"):
            value = getattr(self, key)
            if value and any(c.isspace() for c in value):
                raise ValueError(f"{key}: must not contain spaces")
        if self.engine == "slurm" and (self.ssh_config or self.topology):
            raise ValueError("ssh_config and topology are clush settings (engine: clush)")
        if self.gateway_python and not self.topology:
            raise ValueError("gateway_python is for clush tree mode (topology): set topology too")
        return self


class Spec(Model):
    """The whole spec file."""

    name: Name
    description: Text = ""
    hosts: Annotated[dict[Ident, Host], Field(min_length=1)]
    transfer: Transfer
    cuda: Optional[Cuda] = None
    gpu: Optional[Gpu] = None
    checks: list[Check] = Field(default_factory=_empty_list)
    # when a check fails after the swap: put the previous install back (needs on_existing: backup),
    # or keep the new one. Default: rollback where a backup exists, else keep.
    on_failed_checks: Optional[Literal["rollback", "keep"]] = None

    @field_validator("on_failed_checks")
    @classmethod
    def _rollback_needs_backup(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        transfer = info.data.get("transfer")
        if value == "rollback" and transfer is not None and transfer.on_existing != "backup":
            raise ValueError("rollback needs a previous install to go back to: set "
                             "transfer.on_existing: backup")
        return value
    env: dict[Annotated[str, AfterValidator(_env_name)], Annotated[str, AfterValidator(_nonempty)]] = (
        Field(default_factory=_empty_dict))
    # install on many nodes through the cluster's engine; transfer.to's host is where the engine
    # runs (this machine), its path the destination on every node
    fanout: Optional[Fanout] = None

    @field_validator("fanout")
    @classmethod
    def _fanout_head_is_here(cls, value: Optional[Fanout], info: ValidationInfo) -> Optional[Fanout]:
        transfer, hosts = info.data.get("transfer"), info.data.get("hosts") or {}
        if value is not None and transfer is not None:
            head = hosts.get(transfer.target[0])
            if head is not None and not head.local:
                raise ValueError("with fanout, transfer.to names `local: true` host (where the "
                                 "engine runs) and the path on every node")
        return value


def failed_checks_policy(spec: Spec) -> str:
    if spec.on_failed_checks:
        return spec.on_failed_checks
    return "rollback" if spec.transfer.on_existing == "backup" else "keep"
