"""What the notebooks in this folder import from the repository around them.

``import _support`` (a notebook's kernel runs in this folder) puts the repository root on
``sys.path``, so that the demo (``graphs``) and the test helpers import from a checkout,
and on ``PYTHONPATH``, so that the processes the demo starts import the same files (the
batch's fork server is a fresh interpreter; on Python 3.11 it does not inherit
``sys.path``). The library itself comes from the environment
(``pip install -e '.[notebooks]'``).

``RedisServer`` is the repository's one throwaway ``redis-server`` launcher
(``tests/support/redis_servers.py``): a free loopback port, no persistence, its own
temporary directory, and it dies with the kernel.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )

from tests.support.redis_servers import RedisServer  # noqa: E402  (needs ROOT on the path)

__all__ = ["ROOT", "RedisServer"]
