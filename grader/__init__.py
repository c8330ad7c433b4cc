"""The instructor's side of the distlab course: release, autograde, feedback, export (see README.md)."""

from grader.deferred_imports import defer_iri_grammar

defer_iri_grammar()  # before anything imports nbformat (and with it jsonschema)
