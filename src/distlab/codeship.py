"""Keep file names and source lines on functions sent to ranks by value.

cloudpickle replaces every shipped code object's file name with "<dynamic-code>", so a rank's
traceback would lose the learner's lines. We send the names (in the code tree's order) and the
source lines alongside, and put them back on the rank.
"""

from __future__ import annotations

import linecache
import types
from collections.abc import Callable, Iterator
from typing import Any


def _walk(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _walk(const)


def describe(fn: Callable[..., Any]) -> tuple[tuple[str, ...], dict[str, list[str]]]:
    """(file name of each code object, source lines of each file) for ``fn``."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return (), {}
    files = tuple(c.co_filename for c in _walk(code))
    sources = {name: linecache.getlines(name) for name in set(files)}
    return files, {name: lines for name, lines in sources.items() if lines}


def _restore(code: types.CodeType, files: Iterator[str]) -> types.CodeType:
    filename = next(files, code.co_filename)
    consts = tuple(_restore(c, files) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def restore(fn: Any, files: tuple[str, ...], sources: dict[str, list[str]]) -> None:
    """Put ``describe``'s names back on a received function and its source into linecache."""
    for name, lines in sources.items():
        linecache.cache[name] = (sum(map(len, lines)), None, lines, name)
    if files and isinstance(fn, types.FunctionType):
        fn.__code__ = _restore(fn.__code__, iter(files))
