"""Public path: the names of :mod:`langchain_idempotent.integrations.mcp`.

``langchain_idempotent.mcp`` re-exports them, and each of its public modules has a public
path here too.
"""

# public path: written by scripts/relayout.py
from ..integrations.mcp import *  # noqa: F403
