"""Python source parsed for the checks that read the code itself (the import contract,
the names the prose uses)."""

from __future__ import annotations

import ast
import gc


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` with the garbage collector paused. On CPython 3.11, Python code that
    runs inside ``compile()``'s AST conversion can make it fail with "SystemError: AST
    constructor recursion depth mismatch" (https://github.com/python/cpython/issues/106905):
    a collection there finalized an asyncio Task an earlier test in the same worker left
    pending, and its log line ran in the middle of the parse."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename)
    finally:
        if enabled:
            gc.enable()
