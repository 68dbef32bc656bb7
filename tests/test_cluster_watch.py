"""The watch beside a multi-node job (tau2_rl_pipeline/cluster/watch.py): its verdicts over the GCS's
node table, as `ray.nodes()` gives it. The watch itself, on separate hosts with a link cut, a raylet killed and the
head's Ray killed, is tests/contract/test_hosts_faults.py (the hosts tier)."""

from __future__ import annotations

from tau2_rl_pipeline.cluster.watch import head_lost, lost_node

HEAD, WORKER = "198.18.0.1", "198.18.0.2"


def row(address: str, alive: bool, reason: str = "") -> dict:
    return {"NodeManagerAddress": address, "Alive": alive, "DeathReasonMessage": reason}


def test_every_node_alive_is_no_verdict() -> None:
    assert lost_node([HEAD, WORKER], HEAD, [row(HEAD, True), row(WORKER, True)]) is None


def test_a_dead_worker_is_named_with_rays_reason() -> None:
    line = lost_node([HEAD, WORKER], HEAD, [row(HEAD, True),
                                            row(WORKER, False, "health check failed due to missing too many heartbeats")])
    assert line == (f"worker {WORKER} left the Ray cluster during the job (Ray marked its node dead: health check "
                    "failed due to missing too many heartbeats)")


def test_a_node_gone_from_the_table_and_the_head_are_named_as_such() -> None:
    assert lost_node([HEAD, WORKER], HEAD, [row(HEAD, True)]) == f"worker {WORKER} is not in the Ray cluster any more"
    assert lost_node([HEAD, WORKER], HEAD, [row(HEAD, False), row(WORKER, True)]).startswith(f"the head {HEAD} left")
    assert "no reason given" in lost_node([WORKER], HEAD, [row(WORKER, False)])


def test_a_node_that_came_back_counts_as_alive_and_the_first_lost_is_named() -> None:
    third = "198.18.0.3"
    table = [row(HEAD, True), row(WORKER, False, "old"), row(WORKER, True), row(third, False, "raylet died")]
    assert lost_node([HEAD, WORKER, third], HEAD, table) == (f"worker {third} left the Ray cluster during the job (Ray "
                                                             "marked its node dead: raylet died)")


def test_a_silent_gcs_names_the_head() -> None:
    assert head_lost(HEAD, 6379, 10.4) == (f"the head {HEAD}: its Ray (GCS {HEAD}:6379) stopped answering during the "
                                           "job (10 s without an answer)")
