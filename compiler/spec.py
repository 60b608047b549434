"""Stage 2: the spec's schema. Pydantic models, extra keys forbidden, every string checked.

Anything that will reach a shell is validated here first, even though rendering quotes it anyway:
the runbook runs as root on expensive machines, so a hostile or mistyped value is refused with a
message that points at the spec, rather than quoted and carried along. The field types are in
compiler/fields.py, ssh addresses in compiler/sshaddr.py, `fanout:` and its node set in
compiler/nodeset.py.
"""

# No `from __future__ import annotations` here: pydantic would then eval() every field's
# annotation string when it builds the models at import (~2 ms of each compile).
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)
from rbrules import choices

from .fields import (
    AbsPath,
    At,
    Capability,
    EndpointText,
    Exclude,
    Ident,
    IdentityPath,
    Model,
    ModuleName,
    Name,
    NonEmpty,
    Port,
    Snippet,
    Text,
    Version,
    _empty_dict,
    _empty_list,
    _env_name,
    _gpu_model,
    _nonempty,
    _path,
    parse_endpoint,
)
from .nodeset import Fanout
from .sshaddr import Jump, SshConfigPath, SshTarget, _ssh_option_key, parse_ssh_uri


class Host(Model):
    """One machine the runbook touches: reached over ssh, or this machine itself (`local: true`)."""

    ssh: Optional[SshTarget] = None
    local: StrictBool = False
    port: Optional[Port] = None
    identity_file: Optional[IdentityPath] = None
    jump: Optional[Jump] = None
    # an ssh config file of this machine, given to ssh as -F for every connection to this host
    # (the host may be an alias it defines): its bastions, users, keys and ports work as they do
    # with plain `ssh -F FILE HOST`; the options the runbook sets (BatchMode, host key checking,
    # connection sharing, ConnectTimeout, and the spec's own) come first and win
    ssh_config: Optional[SshConfigPath] = None
    host_keys: Literal["strict", "accept-new"] = "strict"
    connect_timeout: Annotated[int, Field(strict=True, ge=1, le=300)] = 10
    # only the ssh options a relay needs (compiler/sshopts.py: an allowlist, values checked)
    options: dict[Annotated[str, AfterValidator(_ssh_option_key)], NonEmpty] = Field(
        default_factory=_empty_dict
    )

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
        return {
            key: sshopts.known_hosts_files(value) if key.lower() in sshopts.KNOWN_HOSTS else value
            for key, value in options.items()
        }

    @model_validator(mode="before")
    @classmethod
    def _ssh_uri(cls, data: Any) -> Any:
        """`ssh: ssh://user@host:2222` is read as `ssh: user@host` with `port: 2222`."""
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("ssh"), str)
            or not data["ssh"].startswith("ssh://")
        ):
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
        if self.local and (
            self.port or self.identity_file or self.jump or self.options or self.ssh_config
        ):
            raise ValueError(
                "ssh settings (port, identity_file, jump, options, ssh_config) need `ssh:`"
            )
        return self


class Transfer(Model):
    from_: EndpointText = Field(alias="from")
    to: EndpointText
    route: Literal["relay", "direct", "auto"] = "relay"
    compression: Literal["auto", "zstd", "lz4", "gzip", "none"] = "auto"
    exclude: list[Exclude] = Field(default_factory=_empty_list)
    verify: Literal[choices.ALGOS] = "sha256"
    on_existing: Literal[choices.ON_EXISTING] = "refuse"
    # re-run check: quick compares path/size/mode/mtime on both ends (like rsync); digest re-hashes
    rerun: Literal[choices.RERUN] = "quick"
    # the cores the kit may use on each host (None: one per CPU): hashing threads, and where the
    # sending end starts the receiving ends (both on one host, route direct) one stream per two
    jobs: Optional[Annotated[int, Field(strict=True, ge=1, le=256)]] = None
    # route direct/auto: how the source host reaches the destination with its own ssh setup
    # (default: the destination's `ssh:` and `port:`; keys and known_hosts are the source's own).
    direct: Optional[Host] = None
    # Hostile source and host (docs/design.md, "Threat model"); the kit's side is rbkit.hostfs.
    # Entries with setuid, setgid, sticky or world-write bits: refused in preflight (moved by root,
    # a setuid file of another user would arrive setuid-root), installed without them, or kept.
    special_modes: Literal[choices.SPECIAL_MODES] = "refuse"
    # Symlinks that leave the tree (the venv's bin/python* excepted): refused, or moved as they are.
    outside_links: Literal[choices.OUTSIDE_LINKS] = "refuse"
    # Backups (on_existing: backup) kept after a successful swap; older ones are removed.
    keep_backups: Annotated[int, Field(strict=True, ge=1, le=100)] = 2
    # A file system that cannot swap in one rename (no RENAME_EXCHANGE, e.g. NFS): refuse, or swap
    # with two renames journaled beside the destination (finished or undone by the next run).
    swap_atomic: Literal[choices.SWAP_ATOMIC] = "allow"
    # A destination whose parent (or a directory above it) another user can write: the lock, the
    # staging, the backups and the env file live there, so it is refused in preflight; allow: a
    # warning naming it, and the run goes on (the checks still source the install's own env file).
    shared_parent: Literal[choices.SHARED_PARENT] = "refuse"

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, populate_by_name=True, defer_build=True
    )

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
        for index, folder in enumerate(self.library_path_first):
            if folder.startswith("/") or ".." in folder.split("/") or folder.startswith("-"):
                raise ValueError(
                    f"library_path_first[{index}]: {folder!r} must be relative to the venv's "
                    "site-packages"
                )
        return self


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
                "each check is a mapping with exactly one of: "
                + ", ".join(CHECK_TYPES)
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
            field_value = getattr(value, name)
            if name != "allow_skip" and field_value is not None:
                out[name] = list(field_value) if isinstance(field_value, list) else field_value
        return out

    @property
    def allow_skip(self) -> bool:
        value = getattr(self, self.kind)
        return bool(getattr(value, "allow_skip", False))


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
    on_failed_checks: Optional[Literal[choices.ON_FAILED_CHECKS]] = None

    @field_validator("on_failed_checks")
    @classmethod
    def _rollback_needs_backup(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        transfer = info.data.get("transfer")
        if value == "rollback" and transfer is not None and transfer.on_existing != "backup":
            raise ValueError(
                "rollback needs a previous install to go back to: set transfer.on_existing: backup"
            )
        return value

    env: dict[
        Annotated[str, AfterValidator(_env_name)], Annotated[str, AfterValidator(_nonempty)]
    ] = Field(default_factory=_empty_dict)
    # install on many nodes through the cluster's engine; transfer.to's host is where the engine
    # runs (this machine), its path the destination on every node
    fanout: Optional[Fanout] = None

    @field_validator("fanout")
    @classmethod
    def _fanout_head_is_here(
        cls, value: Optional[Fanout], info: ValidationInfo
    ) -> Optional[Fanout]:
        transfer, hosts = info.data.get("transfer"), info.data.get("hosts") or {}
        if value is not None and transfer is not None:
            head = hosts.get(transfer.target[0])
            if head is not None and not head.local:
                raise ValueError(
                    "with fanout, transfer.to names `local: true` host (where the "
                    "engine runs) and the path on every node"
                )
        return value


def failed_checks_policy(spec: Spec) -> str:
    if spec.on_failed_checks:
        return spec.on_failed_checks
    return "rollback" if spec.transfer.on_existing == "backup" else "keep"
