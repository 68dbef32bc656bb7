"""SGLang's real router (the sglang-router package, started by scripts/start_router.sh as users start it) in front of
two real loopback servers: the clients reach every server through its one URL, as they reach one server.

The router checks each server's /health before it serves; then the policy engine's native /generate and the user
simulator's OpenAI /v1/chat/completions go through it. With round_robin they alternate over the servers; with the
default cache_aware, the same prompt goes back to the server that already holds its prefix (a conversation's turns
stay where their KV cache is). Its own argument parser reads the script's dry-run command.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.loopback_server import LoopbackServer
from test_scripts import ROOT, run_script

from tau2_rl_pipeline.benchmark.user_client import chat_client, parse_chat_response
from tau2_rl_pipeline.rollout.engines import SamplingParams, SGLangEngine, TransformersEngine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers(tiny_small_dir: Path) -> Iterator[list[LoopbackServer]]:
    started = [LoopbackServer(TransformersEngine.from_pretrained(tiny_small_dir, seed=i)) for i in range(2)]
    for server in started:
        server.start()
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def router(servers: list[LoopbackServer], tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """scripts/start_router.sh, run for real with the policy the test names; its URL once it answers /health."""
    port = free_port()
    env = {**os.environ, "ROUTER_WORKER_URLS": ",".join(s.base_url for s in servers), "ROUTER_PORT": str(port),
           "ROUTER_POLICY": request.param, "ROUTER_METRICS_PORT": str(free_port()), "PYTHON": sys.executable, "TAU2_OUT_DIR": str(tmp_path / "out")}
    with open(tmp_path / "router.log", "wb") as log:
        proc = subprocess.Popen(["bash", str(ROOT / "scripts/start_router.sh")], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # only a router that never comes up takes this long, whatever the load
        while True:
            assert proc.poll() is None, (tmp_path / "router.log").read_text()[-2000:]
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the router did not come up"
                time.sleep(0.2)
        before = [(s.count("/generate"), s.count("/v1/chat/completions")) for s in servers]
        yield url, before
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def generate_through(url: str, n: int) -> None:
    engine = SGLangEngine(url)

    async def go() -> None:
        try:
            for _ in range(n):
                await engine.generate([5, 6, 7, 8], SamplingParams(max_new_tokens=2))
        finally:
            await engine.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("router", ["round_robin"], indirect=True)
def test_the_clients_reach_every_server_through_the_router(router, servers: list[LoopbackServer]) -> None:
    url, before = router
    generate_through(url, 4)
    sent = [s.count("/generate") - b[0] for s, b in zip(servers, before)]
    assert sum(sent) == 4 and min(sent) >= 1, sent  # the same prompt four times, yet on both servers
    client = chat_client(url + "/v1", timeout_s=30, max_retries=0, max_in_flight=4)
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode()

    async def go() -> None:
        try:
            for _ in range(2):
                choice, message = await client.post(body, parse_chat_response)
                assert message.role == "user" and choice["message"]["role"] == "assistant"
        finally:
            await client.aclose()

    asyncio.run(go())
    assert sum(s.count("/v1/chat/completions") - b[1] for s, b in zip(servers, before)) == 2


@pytest.mark.parametrize("router", ["cache_aware"], indirect=True)
def test_the_default_policy_keeps_a_prompt_on_the_server_that_cached_it(router, servers: list[LoopbackServer]) -> None:
    url, before = router
    generate_through(url, 4)
    assert sorted(s.count("/generate") - b[0] for s, b in zip(servers, before)) == [0, 4]


def test_the_routers_own_parser_reads_the_scripts_command(tmp_path: Path) -> None:
    from sglang_router.launch_router import parse_router_args

    result = run_script("start_router.sh", tmp_path, ROUTER_WORKER_URLS="http://10.0.0.2:30001,http://10.0.0.3:30001")
    assert result.rc == 0, result.text
    (cmd,) = [c for c in result.commands if "sglang_router.launch_router" in c]
    args = parse_router_args(cmd[cmd.index("sglang_router.launch_router") + 1:])
    assert args.worker_urls == ["http://10.0.0.2:30001", "http://10.0.0.3:30001"]
    assert (args.host, args.port, args.policy, args.prometheus_port) == ("127.0.0.1", 30100, "cache_aware", 29000)
