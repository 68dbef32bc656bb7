"""Clients of several model servers: the policy engine, eval's --sglang-url (hence RFT's), and the user simulator's
client each take a router's URL or several servers' URLs comma-separated, spread the load over them and pass a
failed one over. Against several real loopback servers (support.loopback_server); SGLang's real
router in front of them is in the contract tier (tests/contract/test_router.py).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.loopback_server import LoopbackServer
from test_eval_passk import SMALL, run_cli
from test_scripts import flags, run_script

from tau2_rl_pipeline.benchmark.user_client import chat_client, parse_chat_response
from tau2_rl_pipeline.benchmark.users import UserConfigError, make_user_factory
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.eval.backends import SetupError, check_sglang
from tau2_rl_pipeline.eval.plan import _safe_url
from tau2_rl_pipeline.http_post import pick_server, split_urls
from tau2_rl_pipeline.rollout.engines import EngineError, SamplingParams, SGLangEngine, TransformersEngine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def servers(tiny_small_dir: Path) -> Iterator[list[LoopbackServer]]:
    """Three loopback servers, each over its own engine (as three SGLang servers on their own GPUs)."""
    started = [LoopbackServer(TransformersEngine.from_pretrained(tiny_small_dir, seed=i), latency_s=0.05)
               for i in range(3)]
    for server in started:
        server.start()
    yield started
    for server in started:
        server.stop()


# ---- picking a server (pure) --------------------------------------------------------------------------------------
def test_the_server_with_the_fewest_in_flight_is_picked_in_turn_on_a_tie() -> None:
    assert pick_server([2, 0, 1], [0.0] * 3, now=10.0, turn=0) == 1
    assert [pick_server([1, 1, 1], [0.0] * 3, now=10.0, turn=t) for t in range(4)] == [0, 1, 2, 0]
    # one that failed rests until its time is up, unless every one rests
    assert pick_server([0, 3, 3], [11.0, 0.0, 0.0], now=10.0, turn=0) == 1
    assert pick_server([0, 3, 3], [11.0, 0.0, 0.0], now=12.0, turn=0) == 0
    assert pick_server([2, 1], [11.0, 11.5], now=10.0, turn=0) == 1


def test_url_lists_are_split_and_checked() -> None:
    assert split_urls(" http://a:1 , http://b:2/v1,") == ["http://a:1", "http://b:2/v1"]
    assert split_urls(["http://a:1"]) == ["http://a:1"]
    for bad, says in ((",", "no server URL"), ("http://a:1,b:2", "must start with http")):
        with pytest.raises(ValueError, match=says):
            split_urls(bad)


# ---- the policy engine (rollout, eval, RFT) -------------------------------------------------------------------------
def test_the_engine_spreads_requests_over_the_servers(servers: list[LoopbackServer]) -> None:
    engine = SGLangEngine(",".join(s.base_url for s in servers))

    async def go() -> list:
        try:
            return await asyncio.gather(*(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
                                          for _ in range(12)))
        finally:
            await engine.aclose()

    assert len(asyncio.run(go())) == 12
    assert [s.count("/generate") for s in servers] == [4, 4, 4]  # all at once: the fewest in flight, in turn
    assert engine.url == ",".join(s.base_url + "/generate" for s in servers)


def test_a_dead_server_is_passed_over_after_it_fails(servers: list[LoopbackServer]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    engine = SGLangEngine([dead, servers[0].base_url, servers[1].base_url], max_retries=2, backoff_base_s=0.01)

    async def go() -> None:
        try:
            for _ in range(6):  # one after the other: the first tries the dead one, its retry and the rest do not
                await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        finally:
            await engine.aclose()

    asyncio.run(go())
    assert servers[0].count("/generate") + servers[1].count("/generate") == 6
    assert servers[0].count("/generate") >= 2 and servers[1].count("/generate") >= 2


def test_when_every_server_fails_the_error_names_them(servers: list[LoopbackServer]) -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    engine = SGLangEngine(",".join(dead), max_retries=1, backoff_base_s=0.01)

    async def go() -> None:
        try:
            await engine.generate([1], SamplingParams(max_new_tokens=1))
        finally:
            await engine.aclose()

    with pytest.raises(EngineError, match="failed after 2 attempts") as err:
        asyncio.run(go())
    assert all(url in str(err.value) for url in dead)


def test_eval_runs_over_several_servers_and_records_them(servers: list[LoopbackServer], tiny_small_dir: Path,
                                                         tmp_path: Path) -> None:
    urls = ",".join(s.base_url for s in servers[:2])
    summary = tmp_path / "run.json"
    rc, _, err = run_cli("--backend", "sglang", "--sglang-url", urls, "--hf-checkpoint", str(tiny_small_dir), *SMALL,
                         "--output", str(summary))
    assert rc == 0, err
    counts = [s.count("/generate") for s in servers[:2]]
    assert min(counts) > 0 and abs(counts[0] - counts[1]) <= max(counts) // 2 + 1, counts
    assert json.loads(summary.read_text())["settings"]["sglang_url"] == urls


def test_eval_checks_every_server_of_the_list(servers: list[LoopbackServer]) -> None:
    check_sglang(",".join(s.base_url for s in servers))
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SetupError, match=f"cannot reach the SGLang server at {dead} "):
        check_sglang(f"{servers[0].base_url},{dead}")
    assert _safe_url("http://u:p@a:1,http://b:2/v1") == "http://a:1,http://b:2/v1"


# ---- the user simulator's client ----------------------------------------------------------------------------------
def test_the_user_client_spreads_calls_over_the_servers(servers: list[LoopbackServer]) -> None:
    client = chat_client(",".join(s.base_url + "/v1" for s in servers[:2]), timeout_s=30, max_retries=0,
                         max_in_flight=8)
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode()

    async def go() -> list[Any]:
        try:
            return await asyncio.gather(*(client.post(body, parse_chat_response) for _ in range(4)))
        finally:
            await client.aclose()

    assert len(asyncio.run(go())) == 4
    assert [s.count("/v1/chat/completions") for s in servers[:2]] == [2, 2]


def test_a_url_list_needs_the_async_user_client() -> None:
    listed = {"TAU2_USER_API_BASE": "http://10.0.0.2:30001/v1,http://10.0.0.3:30001/v1",
              "TAU2_USER_MODEL": "openai/q"}
    assert make_user_factory("llm", Tau2Config.from_env(listed)).client.urls == [
        "http://10.0.0.2:30001/v1/chat/completions", "http://10.0.0.3:30001/v1/chat/completions"]
    with pytest.raises(UserConfigError, match="only the async client spreads"):
        make_user_factory("llm", Tau2Config.from_env({**listed, "TAU2_USER_CLIENT": "litellm"}))


# ---- scripts: the router, and the servers a script checks --------------------------------------------------------
def test_start_router_runs_sglangs_router_in_front_of_the_servers(tmp_path: Path) -> None:
    result = run_script("start_router.sh", tmp_path, ROUTER_WORKER_URLS="http://10.0.0.2:30001,http://10.0.0.3:30001/",
                        ROUTER_HOST="0.0.0.0", ROUTER_PORT="31100", ROUTER_POLICY="round_robin",
                        ROUTER_METRICS_PORT="31101")
    assert result.rc == 0, result.text
    (cmd,) = [c for c in result.commands if "sglang_router.launch_router" in c]
    assert cmd[:3] == ["python3", "-m", "sglang_router.launch_router"]
    assert cmd[cmd.index("--worker-urls") + 1:] == ["http://10.0.0.2:30001", "http://10.0.0.3:30001/"]
    got = flags(cmd[:cmd.index("--worker-urls")])
    assert (got["--host"], got["--port"], got["--policy"], got["--prometheus-port"]) == ("0.0.0.0", "31100",
                                                                                         "round_robin", "31101")
    default = run_script("start_router.sh", tmp_path, ROUTER_WORKER_URLS="http://10.0.0.2:30001")
    assert flags(next(c for c in default.commands if "--policy" in c))["--policy"] == "cache_aware"


@pytest.mark.parametrize("env, says", [
    ({}, "ROUTER_WORKER_URLS is empty"),
    ({"ROUTER_WORKER_URLS": "http://10.0.0.2:30001/v1"}, "'http://10.0.0.2:30001/v1' is not http://host:port"),
    ({"ROUTER_WORKER_URLS": "http://10.0.0.2:30001", "ROUTER_POLICY": "fastest"}, "ROUTER_POLICY=fastest is not one of"),
])
def test_start_router_refuses_bad_settings_in_one_line(tmp_path: Path, env: dict[str, str], says: str) -> None:
    result = run_script("start_router.sh", tmp_path, **env)
    assert result.rc == 1 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_rft_samples_from_every_listed_policy_server(tmp_path: Path) -> None:
    urls = "http://10.0.0.2:30000,http://10.0.0.3:30000"
    result = run_script("generate_rft.sh", tmp_path, RFT_POLICY_URL=urls)
    assert result.rc == 0, result.text
    (cmd,) = [c for c in result.commands if "tau2_rl_pipeline.selection.rft" in c]
    assert flags(cmd)["--sglang-url"] == urls
    assert all(f"not checking that policy server (scripts/start_policy_server.sh) answers at {u}/health" in result.stderr
               for u in urls.split(","))


def test_each_listed_user_simulator_is_started_on_its_own(tmp_path: Path) -> None:
    listed = "http://10.0.0.2:30001/v1,http://10.0.0.3:30001/v1"
    result = run_script("start_user_sim.sh", tmp_path, TAU2_USER_API_BASE=listed, TAU2_USER_MODEL="openai/user")
    assert result.rc == 1 and "lists several servers: start each one with TAU2_USER_API_BASE set to its own URL" \
        in result.stderr and len(result.stderr.strip().splitlines()) == 1
    one = run_script("start_user_sim.sh", tmp_path, TAU2_USER_API_BASE=listed.split(",")[1],
                     TAU2_USER_MODEL="openai/user", USER_SIM_HOST="0.0.0.0")
    server = flags(next(c for c in one.commands if "sglang.launch_server" in c))
    assert (server["--host"], server["--port"]) == ("0.0.0.0", "30001")
