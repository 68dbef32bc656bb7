"""tau2 staged RL cookbook: tasks -> episode -> token-in/token-out rollout -> reward -> trainer / Pass@K."""

import os as _os
import sys as _sys

# litellm fetches a model cost map from the network at import unless told not to (offline machines hang).
_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# transformers draws a progress bar per checkpoint load (it reads this when imported): every evaluation and stage
# loads one, and the bars buried the run's own lines. Set it to 0 to see them.
_os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _quiet_tau2_logging() -> None:
    """tau2 logs through loguru at DEBUG by default; keep our consoles readable (TAU2_LOG_LEVEL to change)."""
    try:
        from loguru import logger
    except ImportError:  # tau2 not installed: nothing to quiet
        return
    logger.remove()
    logger.add(_sys.stderr, level=_os.environ.get("TAU2_LOG_LEVEL", "ERROR"))


_quiet_tau2_logging()
