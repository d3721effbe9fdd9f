"""This machine as the policy needs it: every address of every interface, and the networks of
its guests' bridges, read from `ip -json -details address show`.

`read_machine_view` runs `ip` (a few milliseconds); the server reads it at start and again
whenever the kernel reports a link, address or route change (`machine_watch`).
`machine_view_from_ip` is the pure part: the JSON in, a `policy.MachineView` out.

Which interfaces are guests' bridges (their whole network is never reached): every interface
whose link kind is `bridge`, and every interface whose name starts with a prefix container and
VM managers use (`GUEST_PREFIXES`: docker, podman, libvirt, LXC/LXD/Incus, CNI, Kubernetes
plugins, VirtualBox, VMware). Only the networks of their addresses count; a bridge without an
address has no network here. `veth*` ends are NOT bridges: a veth's own address is this
machine's like any other, and its peer is judged by its address class (the test internet's
hosts sit behind veth pairs).

Security limitations: this module does NOT
- recognize a guest reached over a routed veth, a tun/tap or a VPN interface with an address of
  its own: only the address on this machine's end is refused, the peer is judged by its class
  (a private peer is reachable when `[lan]` lists it);
- tell a bridge that carries the uplink (`br0` enslaving `eth0`) from a guests' bridge: that
  LAN's subnet is then never reached (fail closed, a `[lan]` grant into it is refused);
- see addresses added while a read is under way (the change message that follows reads it
  again; a failed read keeps the previous view), nor other network namespaces' interfaces: the
  kernel's route at dial time (`route_check`) is the judgement that sees every local address;
- know this machine's names: `judge_target` refuses `localhost`, the rest only by their answer.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import subprocess
from collections.abc import Sequence
from typing import Any

from lnk_proxy.policy import MachineView
from lnk_shared.addresses import IPAddress, IPNetwork
from lnk_shared.errors import StateError

__all__ = [
    "GUEST_KINDS",
    "GUEST_PREFIXES",
    "IP_COMMAND",
    "machine_view_from_ip",
    "read_machine_view",
]

log = logging.getLogger(__name__)

IP_COMMAND = ("/usr/sbin/ip", "-json", "-details", "address", "show")  # iproute2, Debian's path
IP_TIMEOUT_S = 10.0  # `ip` answers in milliseconds; a hang means a wedged netlink, not slowness
GUEST_KINDS = frozenset({"bridge"})  # link kinds whose network belongs to guests
GUEST_PREFIXES = (
    "docker",  # Docker's default bridge
    "br-",  # Docker's user-defined networks
    "podman",  # Podman's default network
    "cni",  # CNI's bridge plugin (cni0, cni-podman0)
    "virbr",  # libvirt
    "lxcbr",  # LXC
    "lxdbr",  # LXD
    "incusbr",  # Incus
    "vboxnet",  # VirtualBox host-only
    "vmnet",  # VMware
    "flannel",  # Kubernetes: flannel.1
    "cali",  # Kubernetes: Calico
    "weave",  # Kubernetes: Weave Net
    "cilium",  # Kubernetes: Cilium
    "kube-bridge",  # Kubernetes: kube-router
)


def machine_view_from_ip(
    interfaces: Any, unsafe_public_networks: Sequence[IPNetwork] = ()
) -> MachineView:
    """The view from `ip -json -details address show`'s output (parsed JSON).

    Raises ValueError when the document is not a list of interfaces, or an address in it is not
    an address: a view missing addresses would let a sandbox reach this machine.
    """
    if not isinstance(interfaces, list):
        raise ValueError("not a list of interfaces")
    addresses: set[IPAddress] = set()
    networks: list[IPNetwork] = []
    for interface in interfaces:
        if not isinstance(interface, dict):
            raise ValueError("an interface that is not an object")
        guest = _is_guest_bridge(interface)
        for info in interface.get("addr_info", []):
            if not isinstance(info, dict) or "local" not in info:
                continue  # ip prints {} for an address it could not read with -details
            local, prefix = str(info["local"]), info.get("prefixlen")
            if not isinstance(prefix, int):
                raise ValueError(f"{interface.get('ifname')!r}: {local} has no prefix length")
            addresses.add(ipaddress.ip_address(local.partition("%")[0]))
            if guest:
                network = ipaddress.ip_interface(f"{local.partition('%')[0]}/{prefix}").network
                if network not in networks:
                    networks.append(network)
    return MachineView(
        local_addresses=frozenset(addresses),
        local_networks=tuple(networks),
        unsafe_public_networks=tuple(unsafe_public_networks),
    )


def _is_guest_bridge(interface: dict[str, Any]) -> bool:
    name = interface.get("ifname")
    if not isinstance(name, str):
        raise ValueError("an interface without a name")
    linkinfo = interface.get("linkinfo")
    kind = linkinfo.get("info_kind") if isinstance(linkinfo, dict) else None
    return kind in GUEST_KINDS or name.startswith(GUEST_PREFIXES)


def read_machine_view(unsafe_public_networks: Sequence[IPNetwork] = ()) -> MachineView:
    """Run `ip` and read this machine's view; StateError when it cannot be read."""
    try:
        done = subprocess.run(
            IP_COMMAND, capture_output=True, timeout=IP_TIMEOUT_S, check=True, text=True
        )
        return machine_view_from_ip(json.loads(done.stdout), unsafe_public_networks)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise StateError(
            f"cannot read this machine's addresses with {' '.join(IP_COMMAND)}: {exc}; "
            "install iproute2 (the proxy refuses to run without knowing them)"
        ) from None
