"""``python -m langchain_idempotent``: the operator CLI (see :mod:`langchain_idempotent.cli`)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
