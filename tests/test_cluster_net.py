"""The interface variables on every node (tau2_rl_pipeline/cluster/net.py), pure: which interfaces
GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME select, by Gloo's rules (exact names, each a device) and NCCL's (prefixes,
`^` excludes, `=` exact, one interface with an address is enough), and the cluster check's one line naming the node
that lacks its interface. The same judge on a real two-raylet cluster: tests/contract/test_ray_cluster.py; on this
node before Ray starts (scripts/cluster.sh): tests/test_cluster_scripts.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tau2_rl_pipeline.cluster.check import NodeView, build_parser, interface_problems
from tau2_rl_pipeline.cluster.net import interface_problem, main, matching, read_interfaces

WORKER = {"ens5": ("198.18.0.2",), "lo": ("127.0.0.1",)}  # a worker whose interface has another name
HEAD = {"eth0": ("198.18.0.1",), "lo": ("127.0.0.1",)}


@pytest.mark.parametrize("value, selected, unknown", [
    ("ens", ["ens5"], []),  # a prefix
    ("eth,ens", ["ens5"], ["eth"]),  # one of the prefixes is enough for NCCL
    ("=ens", [], ["ens"]),  # `=`: exact names
    ("=ens5,lo", ["ens5", "lo"], []),
    ("^lo", ["ens5"], []),  # `^`: everything but
    ("^=ens", ["ens5", "lo"], ["ens"]),  # `^` then `=`, as NCCL reads them
    ("^ens,l", [], []),
])
def test_nccls_syntax(value: str, selected: list[str], unknown: list[str]) -> None:
    assert matching("NCCL_SOCKET_IFNAME", value, sorted(WORKER)) == (selected, unknown)


@pytest.mark.parametrize("value, selected, unknown", [
    ("ens5", ["ens5"], []),
    ("ens", [], ["ens"]),  # no prefixes
    ("ens5,lo", ["ens5", "lo"], []),  # several devices
    ("=ens5", [], ["=ens5"]),  # NCCL's marks are part of the name for Gloo
    ("^lo", [], ["^lo"]),
])
def test_gloos_syntax(value: str, selected: list[str], unknown: list[str]) -> None:
    assert matching("GLOO_SOCKET_IFNAME", value, sorted(WORKER)) == (selected, unknown)


def test_the_verdicts_name_what_the_node_has() -> None:
    has = "(it has: ens5, lo)"
    cases = {
        ("GLOO_SOCKET_IFNAME", "eth0"): f"GLOO_SOCKET_IFNAME=eth0 names no network interface there {has}",
        ("GLOO_SOCKET_IFNAME", "ens5,eth0"): f"GLOO_SOCKET_IFNAME=ens5,eth0: eth0 is no network interface there {has}",
        ("GLOO_SOCKET_IFNAME", "ens5"): None,
        ("NCCL_SOCKET_IFNAME", "eth"): f"NCCL_SOCKET_IFNAME=eth names no network interface there {has}",
        ("NCCL_SOCKET_IFNAME", "=en"): f"NCCL_SOCKET_IFNAME==en names no network interface there {has}",
        ("NCCL_SOCKET_IFNAME", "^ens,lo"): f"NCCL_SOCKET_IFNAME=^ens,lo excludes every network interface there {has}",
        ("NCCL_SOCKET_IFNAME", "eth,en"): None,
        ("NCCL_SOCKET_IFNAME", "^docker,lo"): None,
    }
    assert {key: interface_problem(*key, WORKER, "there") for key in cases} == cases


def test_an_interface_without_an_address_is_not_enough() -> None:
    """Gloo binds each device to its interface's address and NCCL uses only interfaces with one."""
    down = {"ens5": (), "ens6": ("198.18.0.2",), "lo": ("127.0.0.1",)}
    assert interface_problem("GLOO_SOCKET_IFNAME", "ens5", down, "there") == (
        "GLOO_SOCKET_IFNAME=ens5: ens5 holds no address there, Gloo cannot bind to it")
    assert interface_problem("NCCL_SOCKET_IFNAME", "ens", down, "there") is None  # ens6 has one
    assert interface_problem("NCCL_SOCKET_IFNAME", "=ens5", down, "there") == (
        "NCCL_SOCKET_IFNAME==ens5: ens5 hold(s) no address there, NCCL uses none of them")


def test_the_check_names_the_node_whose_interface_has_another_name() -> None:
    nodes = [NodeView("198.18.0.2", 4, interfaces=WORKER), NodeView("198.18.0.1", 4, interfaces=HEAD)]
    settings = [("GLOO_SOCKET_IFNAME", "eth0"), ("NCCL_SOCKET_IFNAME", "eth")]
    assert interface_problems(nodes, settings, "198.18.0.1") == [
        "node 198.18.0.2: GLOO_SOCKET_IFNAME=eth0 names no network interface there (it has: ens5, lo)",
        "node 198.18.0.2: NCCL_SOCKET_IFNAME=eth names no network interface there (it has: ens5, lo)"]
    assert interface_problems(nodes, [("NCCL_SOCKET_IFNAME", "eth,ens")], "198.18.0.1") == []
    assert interface_problems(nodes, [], "198.18.0.1") == []


def test_interface_arguments_are_a_known_variable_and_its_value() -> None:
    args = build_parser().parse_args(["--nodes", "2", "--gpus-per-node", "8", "--interface", "NCCL_SOCKET_IFNAME==eth0",
                                      "--interface", "GLOO_SOCKET_IFNAME=eth0"])
    assert args.interface == [("NCCL_SOCKET_IFNAME", "=eth0"), ("GLOO_SOCKET_IFNAME", "eth0")]
    for bad in ("NCCL_IB_HCA=mlx5", "GLOO_SOCKET_IFNAME=", "eth0"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--nodes", "2", "--gpus-per-node", "8", "--interface", bad])


def test_a_node_reads_its_interfaces_and_their_addresses(tmp_path: Path) -> None:
    """This machine's loopback with its IPv4 address (SIOCGIFADDR); names and IPv6 addresses from the files the
    kernel keeps (here written by the test: no such interface exists, so it holds no IPv4 address)."""
    own = read_interfaces()
    assert own["lo"][0] == "127.0.0.1"
    (tmp_path / "net/ens9").mkdir(parents=True)
    (tmp_path / "if_inet6").write_text("fd000000000000000000000000000002 04 40 00 82     ens9\n"
                                       "00000000000000000000000000000001 01 80 10 80       lo\n")
    assert read_interfaces(str(tmp_path / "net"), str(tmp_path / "if_inet6")) == {
        "ens9": ("fd00:0000:0000:0000:0000:0000:0000:0002",)}
    assert read_interfaces(str(tmp_path / "none"), str(tmp_path / "none")) == {}


def test_the_heads_own_check_prints_a_line_per_problem(capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/cluster.sh runs `main` on the head before Ray starts, with the same rules."""
    assert main(["NCCL_SOCKET_IFNAME=^nosuch0", "GLOO_SOCKET_IFNAME=nosuch0"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("GLOO_SOCKET_IFNAME=nosuch0 names no network interface on this node (it has: ")
    assert main([]) == 0 and capsys.readouterr().out == ""
