"""``python -m benchmarks``: see :mod:`benchmarks.runner`.

``python -m benchmarks --scale [...]`` runs :mod:`benchmarks.scale` (cost as records grow)
and ``python -m benchmarks --workers [...]`` :mod:`benchmarks.workers` (cost as workers
grow) instead, with the rest of the arguments."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--scale"]:
        from .scale import main as scale

        raise SystemExit(scale(sys.argv[2:]))
    if sys.argv[1:2] == ["--workers"]:
        from .workers import main as workers

        raise SystemExit(workers(sys.argv[2:]))
    from .runner import main

    raise SystemExit(main())
