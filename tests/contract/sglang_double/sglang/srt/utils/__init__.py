"""sglang.srt.utils: the one name slime imports at module level (slime/backends/sglang_utils/sglang_engine.py)."""


def kill_process_tree(parent_pid, include_parent: bool = True, skip_pid: int = None):
    """SGLang kills an engine's process tree here; the contract tier never launches an SGLang server process."""
    raise RuntimeError("the SGLang test double launches no server processes, so it has none to kill")
