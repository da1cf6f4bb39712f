"""cluster.yaml's ``hosts``: the machines of provider ssh, each an address
(a host name, IPv4, or IPv6 in brackets), an SSH port and the address the
other nodes reach it at, written in full or as ``address:port`` shorthand.

A field of ``ClusterConfig`` (infra/config/schema.py) rather than the ssh
provider's ``config_section``: its key is ``hosts``, not the provider's
name, and the config checks the nodes it names whatever the provider.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import field_validator

from infra.config.base import Port, Strict, show

# One DNS label (an underscore is tolerated: /etc/hosts and docker names use it).
_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\Z")


def check_address(value: str) -> str:
    """A host name, an IPv4 address or an IPv6 address (brackets dropped)."""
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            raise ValueError(f"{show(value)} in brackets is not an IPv6 address") from None
        return value
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.removesuffix(".").split(".")
    if 0 < len(value) <= 253 and all(_LABEL.match(label) for label in labels):
        return value
    raise ValueError(
        f"{show(value)} is not a host name or IP address (at most 253 characters; "
        "an IPv6 address with a port goes in brackets: [2001:db8::1]:22)"
    )


class HostConfig(Strict):
    """One existing machine (provider: ssh)."""

    address: str  # where this machine reaches it over SSH
    port: Port | Literal[22] = 22
    # Where the other nodes reach it (TF_CONFIG); default: address.
    internal_address: str | None = None

    @field_validator("address")
    @classmethod
    def _address(cls, address: str) -> str:
        return check_address(address)

    @field_validator("internal_address")
    @classmethod
    def _internal(cls, address: str | None) -> str | None:
        return None if address is None else _task_host(check_address(address))

    def task_host(self) -> str:
        """The host part of this node's TF_CONFIG addresses (IPv6 in brackets)."""
        return self.internal_address or _task_host(self.address)


def _task_host(address: str) -> str:
    # TF_CONFIG holds "host:port": an IPv6 address needs its brackets there.
    return f"[{address}]" if ":" in address else address


def host_shorthand(value: Any) -> Any:
    """``pc-1: 10.0.0.5``, ``pc-1: 10.0.0.5:2201`` or ``[2001:db8::1]:2201``
    as shorthand. More than one ':' outside brackets is ambiguous (host:port
    or an IPv6 address?), so it is an error, as in URLs."""
    if not isinstance(value, str):
        return value
    if value.startswith("["):
        match = re.fullmatch(r"\[([^\]]*)\](?::(\d{1,5}))?", value)
        if match is None:
            raise ValueError(f"{show(value)}: write an IPv6 address as [2001:db8::1]:22")
        bracketed = {"address": f"[{match[1]}]"}
        return bracketed if match[2] is None else {**bracketed, "port": int(match[2])}
    if value.count(":") > 1:
        raise ValueError(f"{show(value)}: put an IPv6 address in brackets: [2001:db8::1]:22")
    host, sep, port = value.partition(":")
    if not sep:
        return {"address": value}
    if not re.fullmatch(r"\d{1,5}", port):
        raise ValueError(f"{show(value)}: the port after ':' must be a number")
    return {"address": host, "port": int(port)}
