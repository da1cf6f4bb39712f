"""The ``filter`` query parameter of Compute Engine list calls.

The subset of the real syntax that clients use on instances and firewalls:

* ``field = value``, ``field != value`` (exact match; ``value`` bare or in
  double quotes), ``field eq regex`` / ``field ne regex`` (RE2, whole field),
  ``field:*`` (the field is set) and ``field:value``;
* nested fields with dots (``labels.tfcluster-cluster``,
  ``scheduling.preemptible``);
* expressions side by side (``(a = 1) (b = 2)``) or joined by ``AND`` /
  ``OR``; ``NOT`` before one; parentheses. Like the real API, ``AND`` and
  ``OR`` cannot be mixed at one level without parentheses.

Anything else is a ``FilterError``: the server answers 400, as GCE does,
so a client that sends a filter the fake does not understand fails loudly
instead of silently matching everything.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<lparen>\() |
        (?P<rparen>\)) |
        (?P<op>!=|=|:) |
        (?P<quoted>"(?:[^"\\]|\\.)*") |
        (?P<word>[^\s()=!:"]+)
    )""",
    re.VERBOSE,
)


class FilterError(ValueError):
    """The filter is not one the fake (or GCE) accepts."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise FilterError(f"unexpected character at {pos}: {text[pos:pos + 10]!r}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind == "quoted":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        out.append((kind, value))
        pos = match.end()
    return out


def compile_filter(text: str | None) -> Predicate:
    """A predicate over a resource (its JSON dict) for ``text``."""
    if text is None or not text.strip():
        return lambda _resource: True
    parser = _Parser(_tokens(text))
    predicate = parser.expression()
    if parser.pos != len(parser.tokens):
        raise FilterError(f"unexpected {parser.tokens[parser.pos][1]!r}")
    return predicate


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise FilterError("the filter ends too early")
        self.pos += 1
        return token

    def expression(self) -> Predicate:
        terms = [self.term()]
        joiner: str | None = None
        while True:
            token = self.peek()
            if token is None or token[0] == "rparen":
                break
            if token == ("word", "AND") or token == ("word", "OR"):
                if joiner is not None and joiner != token[1]:
                    raise FilterError("AND and OR mixed without parentheses")
                joiner = token[1]
                self.take()
            elif joiner == "OR":
                raise FilterError("AND and OR mixed without parentheses")
            terms.append(self.term())
        if joiner == "OR":
            return lambda r: any(t(r) for t in terms)
        return lambda r: all(t(r) for t in terms)

    def term(self) -> Predicate:
        token = self.take()
        if token == ("word", "NOT"):
            inner = self.term()
            return lambda r: not inner(r)
        if token[0] == "lparen":
            inner = self.expression()
            if self.take()[0] != "rparen":
                raise FilterError("missing )")
            return inner
        if token[0] != "word":
            raise FilterError(f"expected a field name, got {token[1]!r}")
        field = token[1]
        op_token = self.take()
        if op_token[0] == "op" or op_token in (("word", "eq"), ("word", "ne")):
            op = op_token[1]
        else:
            raise FilterError(f"expected =, !=, :, eq or ne after {field}, got {op_token[1]!r}")
        value_token = self.take()
        if value_token[0] not in ("word", "quoted"):
            raise FilterError(f"expected a value after {field} {op}")
        return _comparison(field, op, value_token[1])


def _lookup(resource: Mapping[str, Any], field: str) -> Any:
    value: Any = resource
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _comparison(field: str, op: str, expected: str) -> Predicate:
    if op in ("eq", "ne"):
        try:
            pattern = re.compile(expected)
        except re.error as exc:
            raise FilterError(f"bad regular expression {expected!r}: {exc}") from None
        want = op == "eq"
        return lambda r: (
            (v := _lookup(r, field)) is not None and pattern.fullmatch(_text(v)) is not None
        ) == want
    if op == ":":
        if expected == "*":
            return lambda r: _lookup(r, field) is not None
        return lambda r: (v := _lookup(r, field)) is not None and expected in _text(v)
    want = op == "="
    return lambda r: (
        (v := _lookup(r, field)) is not None and _text(v) == expected
    ) == want
