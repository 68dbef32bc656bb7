"""During a multi-node slime job: the first node that leaves the Ray cluster, named in one line, so the job stops.

Why: when a worker's link is cut or its raylet dies in the middle of a rollout, slime's driver waits on that node's
engines with no end (a request across a dead link) or ends in an actor traceback that names no machine; when the
head's Ray dies, the driver waits a minute for it. On the namespaced hosts (tests/contract/test_hosts_faults.py) each
of these left the stage script waiting. The watch runs on the head beside the job (scripts/cluster_watch.sh,
`watched_job`), as a Ray driver: every INTERVAL seconds it knocks on the GCS port and reads the GCS's node table
(`ray.nodes()`). Ray's own verdict is taken as it is: a node the table shows dead (its health check missed, about a
minute after a link is cut with Ray's defaults; seconds after a raylet exits) or a GCS that stops answering
(the head's Ray gone) is printed as one line and the watch exits 3; the script then stops the job and the cluster.

    python -m tau2_rl_pipeline.cluster.watch --address 10.0.0.1:6379 --expect 10.0.0.1,10.0.0.2

`lost_node` and `head_lost` are the pure verdicts; Ray and sockets are at the edges.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import sys
import time

LOST = 3  # the exit status that means "a node was lost" (any other: the watch itself failed)
PREFIX = "cluster watch: "


def lost_node(expect: list[str], head: str, table: list[dict]) -> str | None:
    """The first expected node that the GCS's node table (`ray.nodes()` rows) does not show alive, in one line naming
    it and Ray's reason; None while every one is alive. A node that came back (a dead row and a newer alive one for
    the same address) counts as alive."""
    alive = {row.get("NodeManagerAddress") for row in table if row.get("Alive")}
    dead = {row.get("NodeManagerAddress"): row for row in table if not row.get("Alive")}
    for address in expect:
        if address in alive:
            continue
        role = "the head" if address == head else "worker"
        if address in dead:
            reason = dead[address].get("DeathReasonMessage") or "no reason given"
            return f"{role} {address} left the Ray cluster during the job (Ray marked its node dead: {reason})"
        return f"{role} {address} is not in the Ray cluster any more"
    return None


def head_lost(head: str, port: int, unanswered_s: float) -> str:
    """The line for a GCS that stopped answering: the head's Ray is gone, and with it the job's driver."""
    return (f"the head {head}: its Ray (GCS {head}:{port}) stopped answering during the job "
            f"({unanswered_s:.0f} s without an answer)")


def knock(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def watch(address: str, expect: list[str], interval_s: float, gcs_patience_s: float) -> str:
    """Poll until a node is lost; the line saying which."""
    import ray

    host, port = address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1])
    ray.init(address=address, _node_ip_address=host, log_to_driver=False, logging_level="ERROR")
    # ray.nodes() can hang while the GCS is gone: it is asked from a thread, and a call that outlives the patience
    # counts as no answer
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    silent_since: float | None = None
    while True:
        started = time.monotonic()
        table = None
        if knock(host, port, timeout_s=min(interval_s, 5.0)):
            try:
                table = pool.submit(ray.nodes).result(timeout=gcs_patience_s)
            except Exception:  # noqa: BLE001 - no answer from the GCS, whatever the error
                table = None
        if table is None:
            silent_since = silent_since or started
            if time.monotonic() - silent_since >= gcs_patience_s:
                return head_lost(host, port, time.monotonic() - silent_since)
        else:
            silent_since = None
            if (line := lost_node(expect, host, table)) is not None:
                return line
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tau2_rl_pipeline.cluster.watch",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--address", required=True, help="the head's GCS, HOST:PORT")
    parser.add_argument("--expect", required=True, help="the nodes' addresses, comma-separated (the head's first)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between two looks (default 2)")
    parser.add_argument("--gcs-patience", type=float, default=10.0,
                        help="seconds the GCS may go unanswered before the head counts as lost (default 10)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    expect = [ip for ip in args.expect.split(",") if ip]
    print(f"{PREFIX}watching {len(expect)} node(s) ({', '.join(expect)}) every {args.interval:g} s", flush=True)
    line = watch(args.address, expect, args.interval, args.gcs_patience)
    print(f"{PREFIX}{line}", flush=True)
    os._exit(LOST)  # not ray.shutdown(): with the head gone it would wait for the GCS


if __name__ == "__main__":
    sys.exit(main())
