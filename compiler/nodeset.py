"""`fanout:` (docs/fanout.md): its model and its node set, read by ClusterShell's NodeSet when the
spec is checked (compiler/fanout.py), beside the rest of the spec's model."""

# No `from __future__ import annotations` here (see compiler/fields.py).
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from .fields import AbsPath, At, Model


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
    ssh_config: Optional[AbsPath] = None  # clush: ssh -F for every node
    topology: Optional[AbsPath] = None  # clush: tree mode through gateways
    # clush tree mode: the python every gateway runs ClusterShell's gateway with
    # (CLUSTERSHELL_GW_PYTHON_EXECUTABLE); it must import ClusterShell. Default /usr/bin/python3.
    gateway_python: Optional[AbsPath] = None

    @field_validator("success", mode="before")
    @classmethod
    def _success(cls, value: Any) -> Any:
        """One message for both halves of the union (pydantic would give one per member)."""
        if value == "all" or (type(value) is int and 1 <= value <= 4096):
            return value
        quoted = (
            " (a number: write it without quotes)"
            if isinstance(value, str) and value.isdigit()
            else ""
        )
        raise ValueError(
            f'must be "all" or how many nodes must pass (1 to 4096); got {value!r}{quoted}'
        )

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
