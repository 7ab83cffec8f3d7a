"""Public path: this module is :mod:`langchain_idempotent.core.protocol` itself.

Importing ``langchain_idempotent.protocol`` gives that module
(a name patched through either path is patched in both); type checkers see its ``__all__``.
"""

# public path: written by scripts/relayout.py
import sys
from typing import TYPE_CHECKING

from .core import protocol as _module

if TYPE_CHECKING:
    from .core.protocol import *  # noqa: F403

sys.modules[__name__] = _module
