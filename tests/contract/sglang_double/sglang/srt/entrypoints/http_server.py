"""sglang.srt.entrypoints.http_server.launch_server: SGLang's HTTP server, run in the foreground of the process slime's
`launch_server_process` spawns for each engine (slime/backends/sglang_utils/sglang_engine.py).

Here the server is the loopback server (a real tiny model answering SGLang's HTTP contract), bound at exactly
`server_args.host:server_args.port`, as SGLang binds: on a host that lacks the address the bind fails (errno 99,
EADDRNOTAVAIL) and the process ends, which slime's launcher reports ("Server process terminated unexpectedly").
When $SGLANG_DOUBLE_RECORDS names a directory, each launch writes one JSON record there: the host it ran on
(hostname), the address and ports slime gave it, and the bind's outcome. The server ends with the engine actor that
launched it (its parent), as SGLang's server process does when slime kills its engine. A file `hang-HOST-PORT` in
that directory makes the server at HOST:PORT a hung engine (LoopbackServer.hang: /generate and /health_generate
answer no more), for slime's health monitor (`--use-fault-tolerance`) to find; the server takes the file away, so the
engine slime starts in its place, perhaps at the same address, is a sound one.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path


def _record(record: dict) -> None:
    where = os.environ.get("SGLANG_DOUBLE_RECORDS")
    if where:
        path = Path(where) / f"{record['hostname']}-{record['pid']}.json"
        path.write_text(json.dumps(record))


def launch_server(server_args, *args, **kwargs) -> None:
    record = {"hostname": socket.gethostname(), "pid": os.getpid(), "host": server_args.host,
              "port": server_args.port, "nccl_port": server_args.nccl_port,
              "dist_init_addr": server_args.dist_init_addr, "base_gpu_id": server_args.base_gpu_id,
              "node_rank": server_args.node_rank, "error": None}
    parent = os.getppid()
    try:  # the address first, before the model loads: a foreign one fails at once
        with socket.socket(socket.AF_INET6 if ":" in server_args.host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's own bind (aiohttp, uvicorn)
            probe.bind((server_args.host, server_args.port))
    except OSError as exc:
        record["error"] = str(exc)
        _record(record)
        raise SystemExit(1) from None
    from support.loopback_server import LoopbackServer

    try:
        server = LoopbackServer.from_model_dir(server_args.model_path, host=server_args.host, port=server_args.port,
                                               seed=server_args.random_seed)
        server.start()
    except RuntimeError as exc:  # the bind's OSError, as start() reports it
        record["error"] = str(exc.__cause__ or exc)
        _record(record)
        raise SystemExit(1) from None
    _record(record)
    where = os.environ.get("SGLANG_DOUBLE_RECORDS")
    hang_file = Path(where) / f"hang-{server_args.host}-{server_args.port}" if where else None
    while os.getppid() == parent:
        if hang_file is not None and not server.hung and hang_file.exists():
            hang_file.unlink()  # this server's fault: a new engine slime starts at the same address answers
            server.hang()
        time.sleep(0.5)
    server.stop()
