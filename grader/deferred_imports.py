"""Import later what an instructor's command loads and never uses.

Why: nbformat validates notebooks with jsonschema, and jsonschema, when it is imported, imports
``rfc3987_syntax`` (a dependency of the Jupyter server's event schemas) for its "iri" format
check. That package compiles a Lark grammar as it is imported: 0.84 s of a core, a third of a
``python -m grader export``, paid by every command although no notebook schema has an "iri"
field. A stand-in module takes its place until a check first asks for it, then the real one is
imported and answers, so a schema that does check an IRI is checked exactly as before.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

GRAMMAR_MODULE = "rfc3987_syntax"


def defer_iri_grammar() -> None:
    """Put the stand-in in place, unless jsonschema already has (or will never want) the real one."""
    if GRAMMAR_MODULE in sys.modules or "jsonschema._format" in sys.modules:
        return
    if importlib.util.find_spec(GRAMMAR_MODULE) is None:
        return
    stand_in = types.ModuleType(GRAMMAR_MODULE)
    stand_in.__doc__ = "Stands in for rfc3987_syntax until an IRI is checked (grader/deferred_imports.py)."

    def real() -> types.ModuleType:
        if sys.modules.get(GRAMMAR_MODULE) is stand_in:
            del sys.modules[GRAMMAR_MODULE]
        return importlib.import_module(GRAMMAR_MODULE)

    def is_valid_syntax(term: str, value: str) -> bool:  # what jsonschema takes from it
        return bool(real().is_valid_syntax(term, value))

    def anything_else(name: str) -> object:
        if name.startswith("__"):  # the import system asks for __path__ and such: not a use
            raise AttributeError(name)
        return getattr(real(), name)

    stand_in.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
    stand_in.__getattr__ = anything_else  # type: ignore[method-assign]
    sys.modules[GRAMMAR_MODULE] = stand_in
