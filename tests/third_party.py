"""Where the pinned upstream sources for tests are: ../shared/third_party beside the repository, or
$TAU2_THIRD_PARTY (see ../shared/third_party/README.md). Tests only: the project never imports them."""

from __future__ import annotations

import os
from pathlib import Path

THIRD_PARTY_ENV = "TAU2_THIRD_PARTY"
REPO_ROOT = Path(__file__).resolve().parents[1]


def third_party_path() -> Path:
    return Path(os.environ.get(THIRD_PARTY_ENV) or REPO_ROOT.parent / "shared" / "third_party")
