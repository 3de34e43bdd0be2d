"""Structured output's request side (lab 10): what an output must match (:class:`Constraint`: a JSON schema or a
regular expression), the error an engine raises when its grammar compiler cannot take one
(:class:`ConstraintError`, naming the part), and how the lab finds that part (:func:`schema_part`). Each engine
enforces the kinds its ``constraints`` fact names (:meth:`lablib.engines.base.Engine.check_constraint`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lablib.errors import LabError, excerpt


@dataclass
class Constraint:
    """What a request's output must match (structured output, lab 10): a JSON schema (``kind`` "json_schema",
    ``spec`` the schema as a dict) or a regular expression the whole output matches (``kind`` "regex", ``spec``
    the pattern). ``name``: its label in rows (default: the schema's ``title``, or the pattern).
    An engine enforces the kinds its ``constraints`` fact names and refuses the others (:meth:`Engine.check_constraint`)."""

    kind: str
    spec: Any
    name: str = ""

    KINDS: ClassVar[tuple[str, ...]] = ("json_schema", "regex")

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise LabError(f"constraint kind {self.kind!r}: expected one of {', '.join(self.KINDS)}")
        if self.kind == "json_schema" and not isinstance(self.spec, dict):
            raise LabError(
                f"json_schema constraint {self.spec!r:.60}: expected the schema as a dict (json.load a schema file)"
            )
        if self.kind == "regex" and not (isinstance(self.spec, str) and self.spec):
            raise LabError(f"regex constraint {self.spec!r:.60}: expected a non-empty pattern string")
        if not self.name:
            self.name = str(self.spec.get("title") or "schema") if self.kind == "json_schema" else self.spec

    @classmethod
    def json_schema(cls, schema: dict, name: str = "") -> Constraint:
        return cls("json_schema", schema, name)

    @classmethod
    def regex(cls, pattern: str, name: str = "") -> Constraint:
        return cls("regex", pattern, name)

    @property
    def text(self) -> str:
        """The spec as one string: the schema's JSON (keys sorted), or the pattern."""
        import json

        return json.dumps(self.spec, sort_keys=True) if self.kind == "json_schema" else self.spec

    @property
    def key(self) -> tuple[str, str]:
        """What a compiled grammar is cached by: (kind, text)."""
        return (self.kind, self.text)

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name!r}"


class ConstraintError(LabError):
    """An engine could not compile a constraint: names the engine, the constraint and the part of the schema that
    failed (``part``, a path such as ``properties.password.pattern``), what it expected and what to do; the
    engine's own message (``engine_message``, whole) only as a short trailing clause."""

    def __init__(self, engine: str, constraint: Constraint, message: str, part: str | None = None):
        self.engine, self.constraint, self.part, self.engine_message = engine, constraint, part, message
        where = f" at {part}" if part else ""
        if constraint.kind == "regex":
            expected = "a regular expression its grammar compiler supports: check the pattern (lookarounds and "
            expected += "backreferences have no grammar form) or use another engine"
        else:
            expected = "a JSON schema its grammar compiler supports: rewrite or drop that part (lookarounds, "
            expected += "backreferences and some keywords have no grammar form) or use another engine"
        super().__init__(
            f"{engine} cannot compile {constraint.label}{where}: expected {expected} "
            f"({engine} says: {excerpt(message, limit=240) or 'no reason'})"
        )


def schema_part(schema: dict, fails) -> str | None:
    """The deepest part of ``schema`` that fails on its own: ``fails(subschema) -> bool`` (True: the engine cannot
    compile it) tried on every nested property, item and alternative, deepest first; a path such as
    ``properties.password.pattern`` (ending in the keyword when dropping it alone lets the part compile),
    or None when no part fails alone."""

    def walk(node, path):
        if not isinstance(node, dict):
            return
        for key in ("properties", "$defs", "definitions"):
            for name, sub in (node.get(key) or {}).items():
                yield from walk(sub, f"{path}.{key}.{name}" if path else f"{key}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                yield from walk(node[key], f"{path}.{key}" if path else key)
        for key in ("anyOf", "oneOf", "allOf"):
            for i, sub in enumerate(node.get(key) or []):
                yield from walk(sub, f"{path}.{key}[{i}]" if path else f"{key}[{i}]")
        yield path, node

    for path, node in walk(schema, ""):
        if not path or not fails(node):
            continue
        for kw in node:  # the keyword whose removal lets the part compile (pattern, $ref, uniqueItems...)
            if kw not in ("type", "properties", "items", "required") and not fails(
                {k: v for k, v in node.items() if k != kw}
            ):
                return f"{path}.{kw}"
        return path
    return None
