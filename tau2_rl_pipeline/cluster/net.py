"""The network interfaces GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME name, read on a node.

The network interfaces GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME name, on a node: the cluster check's network half
(check.py reads them on every node of the Ray cluster; scripts/cluster.sh runs `main` on the head before Ray
starts).

Why: each worker's `ray start` gets the head's values, and nothing else looks at them before torch.distributed builds
its Gloo group and NCCL its sockets, minutes into a run, with a message that does not name the node. A worker whose
interface has another name (ens5 where the head has eth0) must be refused before training, naming the node.

The rules, as the readers of the variables apply them (`interface_problem`, pure; the only copy of them):

- GLOO_SOCKET_IFNAME (torch's ProcessGroupGloo): comma-separated interface names, each made a Gloo device by its
  exact name; each must be an interface of the node that holds an address (Gloo binds to it).
- NCCL_SOCKET_IFNAME (NCCL's findInterfaces, src/misc/socket.cc): comma-separated prefixes, a leading `^` excludes
  what matches, then a leading `=` makes the names exact; NCCL uses every interface with an address that matches
  (or, with `^`, that does not), so at least one must.

A node's facts are its interfaces and their addresses (`read_interfaces`: /sys/class/net, the IPv4 address of each
by SIOCGIFADDR, the IPv6 ones from /proc/net/if_inet6; stdlib only, as the check runs in Ray's workers anywhere).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys

VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (first) IPv4 address

Interfaces = dict[str, tuple[str, ...]]  # interface name: its addresses (none: it holds no address)


# ---- reading (on each node) --------------------------------------------------------------------------------------
def read_interfaces(sys_net: str = "/sys/class/net", inet6: str = "/proc/net/if_inet6") -> Interfaces:
    """Every interface of this node with its addresses: Gloo and NCCL bind to an interface's address, so a name
    without one is as good as absent. The kernel's files by default; a test passes files it wrote."""
    try:
        names = sorted(os.listdir(sys_net))
    except OSError:
        return {}
    found: dict[str, list[str]] = {name: [] for name in names}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address (EADDRNOTAVAIL), or a name the kernel does not take
                continue
            found[name].append(socket.inet_ntoa(packed[20:24]))
    try:
        with open(inet6, encoding="ascii") as f:
            for line in f:  # address ifindex prefixlen scope flags name
                fields = line.split()
                if len(fields) == 6 and fields[5] in found:
                    found[fields[5]].append(":".join(fields[0][i:i + 4] for i in range(0, 32, 4)))
    except OSError:  # no IPv6 on this kernel
        pass
    return {name: tuple(addrs) for name, addrs in found.items()}


# ---- the verdict (pure) ------------------------------------------------------------------------------------------
def matching(variable: str, value: str, names: list[str]) -> tuple[list[str], list[str]]:
    """(the interfaces among `names` that the value selects, the names it lists that select none of them)."""
    text, exclude, exact = value, False, variable != "NCCL_SOCKET_IFNAME"
    if not exact:
        exclude = text.startswith("^")
        text = text.removeprefix("^")
        exact = text.startswith("=")
        text = text.removeprefix("=")
    wanted = [w for w in text.split(",") if w]

    def hit(name: str, want: str) -> bool:
        return name == want if exact else name.startswith(want)

    selected = [n for n in names if any(hit(n, w) for w in wanted) != exclude]
    return selected, [w for w in wanted if not any(hit(n, w) for n in names)]


def interface_problem(variable: str, value: str, interfaces: Interfaces, where: str) -> str | None:
    """Why `variable`=`value` leaves the node whose `interfaces` these are without the interface(s) it means, or None.
    `where` names the node in the sentence ("there", "on this node")."""
    names = sorted(interfaces)
    selected, unknown = matching(variable, value, names)
    bare = [n for n in selected if not interfaces[n]]
    has = f"(it has: {', '.join(names) or 'none'})"
    if variable == "GLOO_SOCKET_IFNAME":  # every name a device: each must be there, with an address
        if unknown and not selected:
            return f"{variable}={value} names no network interface {where} {has}"
        if unknown:
            return f"{variable}={value}: {unknown[0]} is no network interface {where} {has}"
        if bare:
            return f"{variable}={value}: {bare[0]} holds no address {where}, Gloo cannot bind to it"
        return None
    if len(bare) < len(selected):  # NCCL: one interface with an address is enough
        return None
    if bare:
        return f"{variable}={value}: {', '.join(bare)} hold(s) no address {where}, NCCL uses none of them"
    if value.startswith("^"):
        return f"{variable}={value} excludes every network interface {where} {has}"
    return f"{variable}={value} names no network interface {where} {has}"


def main(argv: list[str] | None = None) -> int:
    """`python -m tau2_rl_pipeline.cluster.net NAME=VALUE...`: each setting that leaves this node
    without its interface, one line each; exit 1 if any."""
    problems = []
    for arg in sys.argv[1:] if argv is None else argv:
        variable, _, value = arg.partition("=")
        if why := interface_problem(variable, value, read_interfaces(), "on this node"):
            problems.append(why)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
