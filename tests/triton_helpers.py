"""What the tests that start a real tritonserver share: the skip (or, with
SCHEDSIM_REQUIRE_TRITON=1 as in CI, the failure) when no server or client is installed,
and small traces."""

import os
from pathlib import Path

import pytest

from schedsim.triton.server import ServerError, find_tritonserver

try:
    INSTALL, WHY = find_tritonserver(), ""
except ServerError as exc:
    INSTALL, WHY = None, str(exc)
REQUIRED = os.environ.get("SCHEDSIM_REQUIRE_TRITON") == "1"
try:
    import aiohttp  # noqa: F401 - the client's transport (the triton extra)
except ImportError:
    INSTALL, WHY = None, "aiohttp is not installed (pip install -e '.[triton]')"

pytestmark = [pytest.mark.triton, pytest.mark.slow,
              pytest.mark.skipif(INSTALL is None and not REQUIRED, reason=WHY)]
"""Mark a module with ``from triton_helpers import pytestmark``."""

if INSTALL is None and REQUIRED:
    pytest.fail(f"SCHEDSIM_REQUIRE_TRITON=1 but {WHY}", pytrace=False)


def poisson_trace(path: Path, rate: float, seconds: float, seq_len: int = 16) -> Path:
    import numpy as np

    t = np.cumsum(np.random.default_rng(7).exponential(1 / rate, int(rate * seconds)))
    path.write_text("request_id,arrival_s,seq_len\n" + "".join(f"{i},{x:.6f},{seq_len}\n" for i, x in enumerate(t)))
    return path
