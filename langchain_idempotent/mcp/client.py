"""Public path: this module is :mod:`langchain_idempotent.integrations.mcp.client` itself.

Importing ``langchain_idempotent.mcp.client`` gives that module
(a name patched through either path is patched in both); type checkers see its ``__all__``.
"""

# public path: written by scripts/relayout.py
import sys
from typing import TYPE_CHECKING

from ..integrations.mcp import client as _module

if TYPE_CHECKING:
    from ..integrations.mcp.client import *  # noqa: F403

sys.modules[__name__] = _module
