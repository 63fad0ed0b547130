"""The scan behind the "no name compared with a string outside its table" tests (frameworks, trainers): each place
in a module's source where a name of the kind is tested against a string literal, so that a new if-chain on a
framework's or a trainer's name fails the test that holds the table to be the one place."""

from __future__ import annotations

import ast
from collections.abc import Callable


def strings(node: ast.expr) -> bool:
    """A string literal, or a tuple, list or set that holds one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(strings(e) for e in node.elts)


def string_checks(tree: ast.Module, names: Callable[[ast.expr], bool], *, membership_left_only: bool = False
                  ) -> list[str]:
    """Each place in ``tree`` that compares what ``names`` says is a name of the kind with a string literal:
    ``==``/``in`` a literal, ``startswith``/``endswith`` on it, or a dict keyed by strings (a literal, or a
    module constant) looked up by it; as "line: the code".

    ``membership_left_only``: in ``x in y`` only ``x`` is the tested name (``"max_length" in trainer``, a dict of
    settings, tests no trainer's name)."""
    # the module's dict constants keyed by strings ({"qlora": "hf", ...}): a lookup in one is a chain of ifs
    tables = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
              and isinstance(node.value, ast.Dict) and node.value.keys
              and all(k is not None and strings(k) for k in node.value.keys)
              for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}

    def keyed(table: ast.expr) -> bool:
        return isinstance(table, ast.Dict) or (isinstance(table, ast.Name) and table.id in tables)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if membership_left_only and isinstance(node.ops[0], (ast.In, ast.NotIn)):
                hit = names(node.left) and any(strings(c) for c in node.comparators)
            else:
                hit = any(names(o) for o in operands) and any(strings(o) for o in operands)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target, method = node.func.value, node.func.attr
            hit = ((method in ("startswith", "endswith") and names(target))
                   or (method == "get" and keyed(target) and bool(node.args) and names(node.args[0])))
        else:
            hit = isinstance(node, ast.Subscript) and keyed(node.value) and names(node.slice)
        if hit:
            found.append(f"{getattr(node, 'lineno', 0)}: {ast.unparse(node)}")
    return found
