"""Public path: this module is :mod:`langchain_idempotent.adapters.middleware` itself.

Importing ``langchain_idempotent.middleware`` gives that module
(a name patched through either path is patched in both); type checkers see its ``__all__``.
"""

# public path: written by scripts/relayout.py
import sys
from typing import TYPE_CHECKING

from .adapters import middleware as _module

if TYPE_CHECKING:
    from .adapters.middleware import *  # noqa: F403

sys.modules[__name__] = _module
