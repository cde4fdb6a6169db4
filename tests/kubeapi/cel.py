"""CEL as the API server evaluates it for admission, on a real CEL runtime (Google's C++ CEL through the
`cel-expr-python` package).

Variables are untyped (dyn) maps here, where the API server types `object` by the resource's OpenAPI schema; for the
expressions admission uses (field access guarded by has(), map keys, list macros, string functions) both give the
same values. Object construction for MutatingAdmissionPolicy (`Object{spec: Object.spec{...}}`,
`JSONPatch{op: ...}`) is rewritten to map literals before compiling, since no schema types are declared here.
"""
from __future__ import annotations

import functools
import re

VARIABLES = ("object", "oldObject", "request", "namespaceObject", "params", "authorizer", "variables")


class CelError(Exception):
    """An expression that did not compile or did not evaluate to a value (the API server's evaluation error)."""


def available() -> bool:
    try:
        import cel_expr_python  # noqa: F401
        return True
    except ImportError:
        return False


@functools.lru_cache(maxsize=1)
def _env():
    from cel_expr_python import cel
    return cel.NewEnv(variables={name: cel.Type.DYN for name in VARIABLES})


@functools.lru_cache(maxsize=512)
def compile_expression(expression: str):
    try:
        return _env().compile(_map_literals(expression))
    except RuntimeError as error:
        raise CelError(f"compilation failed: {error}") from None


_TYPED = re.compile(r"\b(?:Object(?:\.[A-Za-z_][A-Za-z0-9_]*)*|JSONPatch)\s*\{")
_FIELD = re.compile(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:")


def _map_literals(expression: str) -> str:
    """`Object.spec{schedulerName: "x"}` -> `{"schedulerName": "x"}` (outside string literals only)."""
    if not _TYPED.search(expression):
        return expression
    parts = re.split(r"(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')", expression)
    out = []
    for index, part in enumerate(parts):
        if index % 2:
            out.append(part)
            continue
        part = _TYPED.sub("{", part)
        out.append(_FIELD.sub(lambda m: f'{m.group(1)}"{m.group(2)}":', part))
    return "".join(out)


def evaluate(expression: str, **variables):
    """The plain Python value of the expression, or CelError."""
    program = compile_expression(expression)
    data = {name: variables.get(name) for name in VARIABLES}
    try:
        value = program.eval(data=data)
    except RuntimeError as error:
        raise CelError(str(error)) from None
    from cel_expr_python import cel
    if value.type() == cel.Type.ERROR:
        raise CelError(str(value.value()))
    return value.plain_value()


def truth(expression: str, **variables) -> bool:
    value = evaluate(expression, **variables)
    if not isinstance(value, bool):
        raise CelError(f"expression {expression!r} evaluated to {type(value).__name__}, not bool")
    return value
