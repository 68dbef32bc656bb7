"""`ray job submit` where Ray's jobs API is not installed (the contract venv's Ray is the minimal package, without the
dashboard's HTTP server that `ray[default]` brings): the entrypoint runs on this node, the head, as Ray's job
supervisor runs it there: with the runtime env's variables and RAY_ADDRESS naming the cluster's GCS (the address
`ray start --head` wrote to /tmp/ray/ray_current_cluster), its exit status the submit's. slime's entry point
(`$SLIME_DIR/train*.py`) is hosts_job.py's to run (test_hosts_cluster.py: no GPUs here); anything else (the stage
scripts' cluster check) runs as submitted.

    ray job submit --address=http://HEAD:PORT --runtime-env-json='{"env_vars": {...}}' -- python -m ...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> None:
    cut = argv.index("--")
    options, entry = argv[:cut], argv[cut + 1:]
    runtime = next((json.loads(a.split("=", 1)[1]) for a in options if a.startswith("--runtime-env-json=")), {})
    env = {**os.environ, **runtime.get("env_vars", {})}
    env["RAY_ADDRESS"] = Path("/tmp/ray/ray_current_cluster").read_text().split()[0]
    if len(entry) > 1 and Path(entry[1]).name.startswith("train") and Path(entry[1]).parent == Path(env["SLIME_DIR"]):
        os.execve(sys.executable, [sys.executable, str(HERE / "hosts_job.py"), *argv], env)
    os.execvpe(entry[0], entry, env)


if __name__ == "__main__":
    main(sys.argv[1:])
