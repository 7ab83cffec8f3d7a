"""``python -m benchmarks``: see :mod:`benchmarks.runner`."""

from __future__ import annotations

if __name__ == "__main__":
    from .runner import main

    raise SystemExit(main())
