"""Public path: this module is :mod:`langchain_idempotent.integrations.otel` itself.

Importing ``langchain_idempotent.otel`` gives that module
(a name patched through either path is patched in both); type checkers see its ``__all__``.
"""

# public path: written by scripts/relayout.py
import sys
from typing import TYPE_CHECKING

from .integrations import otel as _module

if TYPE_CHECKING:
    from .integrations.otel import *  # noqa: F403

sys.modules[__name__] = _module
