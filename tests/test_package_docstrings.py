"""A package's docstring that lists its modules lists them all: a module added beside them is named there too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "vramscope"
# The packages whose docstring is a list of their modules, one ``:mod:`` line each.
LISTED = ("oom", "run", "training", "tui", "tune")


@pytest.mark.parametrize("package", LISTED)
def test_the_docstring_names_every_module_of_the_package(package: str) -> None:
    folder = SRC / package
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
    modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    unnamed = [m for m in modules if f":mod:`~vramscope.{package}.{m}`" not in doc]
    assert modules and not unnamed, f"vramscope/{package}/__init__.py does not name {unnamed}"
