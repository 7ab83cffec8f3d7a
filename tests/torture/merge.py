"""``python -m tests.torture.merge FILE.json ...``: shards of one store's campaign (each
``python -m tests.torture ... --json FILE``) as one table, and the summary line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .campaign import merge, table

if __name__ == "__main__":
    totals = merge([json.loads(Path(p).read_text()) for p in sys.argv[1:]])
    print(table(totals))
    t = totals.total
    print(
        f"runs={t.runs} claims={t.claims} effects={t.effects} violations={t.violations} "
        f"first_failing_seed={min(t.seeds) if t.seeds else '-'}"
    )
