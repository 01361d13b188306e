"""The schemas a client pays for in tools/list: pydantic's, without what repeats or says nothing.

Pydantic writes a `title` on every property (the name again), `anyOf [X, null]` with `default: null`
for every optional argument, and discriminator tables beside the `oneOf` they describe. None of that
helps an agent choose a call; all of it is read on every session start. Inputs also become strict:
`additionalProperties: false` on every object whose properties are listed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

NULL = {"type": "null"}


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The arguments' schema: strict objects, defaults kept (they are the documented behaviour)."""
    return _lean(model.model_json_schema(by_alias=True), keep_defaults=True)


def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The result's schema: every top-level field typed and described; a nested object (a row) is typed
    `object` and described by its fields' signature, `{kind, line:int, symbol?, evidence[]}` (`?`:
    may be absent, `[]` a list, `{}` an object, `:int|num|bool` the scalar types other than string).
    The full nesting would cost an agent ~50k characters per session start for data it reads anyway.
    Defaults say nothing to a reader of results (empty fields are not sent), so they go."""
    full = _lean(model.model_json_schema(by_alias=True, mode="serialization"), keep_defaults=False)
    definitions = full.pop("$defs", {})
    properties = {name: _shallow(body, definitions) for name, body in full.get("properties", {}).items()}
    return {"type": "object", "properties": properties}


SCALARS = {"integer": "int", "number": "num", "boolean": "bool"}


def _resolved(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str):
        return {**definitions.get(ref.rsplit("/", 1)[-1], {}), **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _shallow(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    node = _resolved(node, definitions)
    out = {k: v for k, v in node.items() if k in ("type", "enum", "description")}
    row = node
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        row = _resolved(node["items"], definitions)
        out["items"] = {k: v for k, v in row.items() if k in ("type", "enum")}
    if isinstance(row.get("properties"), dict):
        signature = _signature(row, definitions)
        out["description"] = f"{out['description']} {signature}" if "description" in out else signature
    return out


def _signature(row: dict[str, Any], definitions: dict[str, Any]) -> str:
    required = set(row.get("required", []))
    parts = []
    for name, body in row["properties"].items():
        body = _resolved(body, definitions)
        kind = body.get("type")
        mark = "" if name in required else "?"
        if kind == "array":
            parts.append(f"{name}[]{mark}")
        elif kind == "object" or "properties" in body:
            parts.append(f"{name}{{}}{mark}")
        else:
            parts.append(f"{name}{mark}" + (f":{SCALARS[kind]}" if kind in SCALARS else ""))
    return "{" + ", ".join(parts) + "}"


def _lean(schema: dict[str, Any], *, keep_defaults: bool) -> dict[str, Any]:
    definitions = schema.pop("$defs", {})
    uses = _ref_counts(schema)
    for body in definitions.values():
        for name, count in _ref_counts(body).items():
            uses[name] = uses.get(name, 0) + count
    inline = {name for name, body in definitions.items() if uses.get(name, 0) <= 1 or "enum" in body}
    context = _Context(definitions, inline, keep_defaults)
    lean = context.node(schema)
    kept = {name: context.node(body) for name, body in definitions.items() if name not in inline}
    if kept:
        lean["$defs"] = kept
    return lean


def _ref_counts(node: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str):
                name = ref.rsplit("/", 1)[-1]
                counts[name] = counts.get(name, 0) + 1
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return counts


class _Context:
    def __init__(self, definitions: dict[str, Any], inline: set[str], keep_defaults: bool) -> None:
        self.definitions = definitions
        self.inline = inline
        self.keep_defaults = keep_defaults

    def node(self, node: dict[str, Any]) -> dict[str, Any]:
        variants = node.get("anyOf")
        if isinstance(variants, list) and NULL in variants and node.get("default", "absent") is None:
            # an optional argument (default null): leaving it out says the same; a null inside a value
            # (`{"path": null}`: no counterpart) is meaningful and keeps its variant
            rest = [v for v in variants if v != NULL]
            node = {k: v for k, v in node.items() if k != "anyOf"}
            if len(rest) == 1:
                node = {**rest[0], **node}
            else:
                node["anyOf"] = rest
            if node.get("default", "absent") is None:
                del node["default"]
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.rsplit("/", 1)[-1] in self.inline:
            # the definition's own keys first, the referring property's description and default over them
            body = self.definitions[ref.rsplit("/", 1)[-1]]
            node = {**body, **{k: v for k, v in node.items() if k != "$ref"}}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("title", "discriminator") or (key == "default" and not self.keep_defaults):
                continue
            out[key] = self._value(key, value)
        if "$ref" in out:
            out["$ref"] = "#/$defs/" + str(out["$ref"]).rsplit("/", 1)[-1]
        if "properties" in out and self.keep_defaults:
            out.setdefault("additionalProperties", False)
        return out

    def _value(self, key: str, value: Any) -> Any:
        if key == "properties" and isinstance(value, dict):
            return {name: self.node(body) for name, body in value.items()}
        if key in ("items", "additionalProperties") and isinstance(value, dict):
            return self.node(value)
        if key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            return [self.node(v) if isinstance(v, dict) else v for v in value]
        return value
