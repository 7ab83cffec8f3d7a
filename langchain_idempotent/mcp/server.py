"""Public path: this module is :mod:`langchain_idempotent.integrations.mcp.server` itself.

Importing ``langchain_idempotent.mcp.server`` gives that module
(a name patched through either path is patched in both); type checkers see its ``__all__``.
"""

# public path: written by scripts/relayout.py
import sys
from typing import TYPE_CHECKING

from ..integrations.mcp import server as _module

if TYPE_CHECKING:
    from ..integrations.mcp.server import *  # noqa: F403

sys.modules[__name__] = _module
