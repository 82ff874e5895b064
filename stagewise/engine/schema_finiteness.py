"""Schema finiteness: whether a JSON schema admits at least one finite value, checked before compiling it.

A schema such as ``{"$ref": "#"}``, ``{"anyOf": [{"$ref": "#"}]}`` or a ``$defs`` cycle through
required properties has no finite instance: a grammar built from it can never finish, and the
grammar library fails on the first token with an error about its parser state. This module
decides it structurally (a least fixed point over the schema's subschemas, without recursion, in
time linear in the schema's size), so such a schema is refused as a 400 before anything is sent.

A subschema is *finite* when every one of its conditions holds: its ``$ref`` target is finite,
every ``allOf`` entry is, some ``anyOf``/``oneOf`` entry is, every required property's schema is,
and, with ``minItems >= 1``, the items' schema is. ``false`` is never finite; keywords it does
not model count as satisfiable (the grammar library judges those itself).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from stagewise.errors import GrammarError

_UNRESOLVED = object()


def check_finite(schema: dict[str, Any], description: str) -> None:
    """Raise :class:`GrammarError` (one line, naming ``description``) when ``schema`` has no finite value."""
    root = _Graph(schema)
    if not root.finite():
        raise GrammarError(f"{description}: the schema admits no finite JSON value "
                           "(a $ref cycle that every value must follow, with no way out)")


def _resolve(root: Any, ref: str) -> Any:
    """The subschema a local ``$ref`` (``#``, ``#/$defs/a``) points at; ``_UNRESOLVED`` for any other."""
    if not ref.startswith("#"):
        return _UNRESOLVED
    node = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else ():
        key = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return _UNRESOLVED
    return node


class _Graph:
    """Subschemas as nodes; each node's conditions as groups of alternatives (node ids)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.root = schema
        self.ids: dict[int, int] = {}  # id(subschema) -> node index
        self.groups: list[list[list[Any]]] = []  # node -> [group -> [alternative subschemas]]
        self._add(schema)
        pending = [schema]
        while pending:
            node = pending.pop()
            for group in self.groups[self.ids[id(node)]]:
                for alt in group:
                    if isinstance(alt, dict) and id(alt) not in self.ids:
                        self._add(alt)
                        pending.append(alt)

    def _add(self, node: dict[str, Any]) -> None:
        self.ids[id(node)] = len(self.groups)
        self.groups.append(self._conditions(node))

    def _conditions(self, node: dict[str, Any]) -> list[list[Any]]:
        groups: list[list[Any]] = []
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _resolve(self.root, ref)
            if target is not _UNRESOLVED:
                groups.append([target])
        every = node.get("allOf")
        if isinstance(every, list):
            groups.extend([entry] for entry in every)
        for key in ("anyOf", "oneOf"):
            entries = node.get(key)
            if isinstance(entries, list):
                groups.append(list(entries))  # empty: unsatisfiable
        properties = node.get("properties")
        required = node.get("required")
        if isinstance(properties, dict) and isinstance(required, list):
            groups.extend([properties[name]] for name in required if isinstance(name, str) and name in properties)
        min_items = node.get("minItems")
        if isinstance(min_items, int) and not isinstance(min_items, bool) and min_items >= 1:
            prefix = node.get("prefixItems")
            prefix = prefix if isinstance(prefix, list) else []
            groups.extend([entry] for entry in prefix[:min_items])
            items = node.get("items")
            if min_items > len(prefix) and isinstance(items, (dict, bool)):
                groups.append([items])
        return groups

    def finite(self) -> bool:
        """Whether the root is finite: a worklist least fixed point (each edge visited once)."""
        missing = [len(groups) for groups in self.groups]  # groups not yet satisfied, per node
        satisfied = [[False] * len(groups) for groups in self.groups]
        dependents: dict[int, list[tuple[int, int]]] = {}  # child node -> (parent node, group index)
        ready: list[int] = []
        for parent, groups in enumerate(self.groups):
            for g, group in enumerate(groups):
                for alt in group:
                    if alt is True or not isinstance(alt, (dict, bool)):
                        if not satisfied[parent][g]:
                            satisfied[parent][g] = True
                            missing[parent] -= 1
                    elif isinstance(alt, dict):
                        dependents.setdefault(self.ids[id(alt)], []).append((parent, g))
            if missing[parent] == 0:
                ready.append(parent)
        done = [False] * len(self.groups)
        while ready:
            child = ready.pop()
            if done[child]:
                continue
            done[child] = True
            for parent, g in dependents.get(child, ()):
                if not satisfied[parent][g]:
                    satisfied[parent][g] = True
                    missing[parent] -= 1
                    if missing[parent] == 0:
                        ready.append(parent)
        return done[0]
