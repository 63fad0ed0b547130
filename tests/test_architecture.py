"""ARCHITECTURE.md tells the truth about the code (issue 23): its floors are tests/test_layering.py's ``FLOORS``,
and every module it points a contributor at (``planner/frameworks/registry.MODULES``, ``cli/common.py``) is there
and holds the name it says."""

from __future__ import annotations

import re
from pathlib import Path

from test_layering import FLOORS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "ARCHITECTURE.md"
SRC = ROOT / "src" / "vramscope"

# `advice/oom.py`, `cli/<command>.py`, `planner/trace/`, `exporters/registry.EXPORTERS`, `cli/common.add_renamed(...)`:
# a path with a folder in it, then perhaps a name in that module.
_REFERENCE = re.compile(r"`((?:[a-z_<>]+/)+(?:[a-z_<>]+(?:\.py)?)?)(?:\.([A-Za-z_]\w*))?(?:\(.*?\))?`")


def floors_in_the_doc(text: str) -> list[tuple[str, ...]]:
    """The packages of each row of the doc's floors table (``| 3 | `sampling/` | ...``), bottom first."""
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, flags=re.MULTILINE)
    return [tuple(re.sub(r"(\.py|/)$", "", name) for name in re.findall(r"`([^`]+)`", cells)) for _, cells in rows]


def references(text: str) -> list[tuple[str, str | None]]:
    """(path, name or None) of every module, folder or module's name the doc points at."""
    return [(path, name or None) for path, name in _REFERENCE.findall(text) if "<" not in path]


def _resolved(path: str) -> Path | None:
    for base in (SRC, SRC.parent, ROOT):
        for candidate in (base / path, base / f"{path}.py"):
            if candidate.exists():
                return candidate
    return None


def test_the_docs_floors_are_the_layering_tests_floors() -> None:
    assert floors_in_the_doc(DOC.read_text(encoding="utf-8")) == list(FLOORS)


def test_every_module_the_doc_points_at_is_there_and_holds_the_name_it_says() -> None:
    found = references(DOC.read_text(encoding="utf-8"))
    assert len(found) > 40  # the table's references are read
    missing = [path for path, _ in found if _resolved(path) is None]
    assert not missing, f"ARCHITECTURE.md names modules that do not exist: {sorted(set(missing))}"
    unnamed = []
    for path, name in found:
        where = _resolved(path)
        if name is None or where is None:
            continue
        module = where / f"{name}.py" if where.is_dir() else where
        if where.is_dir() and module.exists():
            continue  # `planner/trace/engine` read as a folder and its module
        if not where.is_file() or not re.search(rf"\b{re.escape(name)}\b", where.read_text(encoding="utf-8")):
            unnamed.append(f"{path}.{name}")
    assert not unnamed, f"ARCHITECTURE.md names what these modules do not hold: {unnamed}"


def test_the_reference_reader_sees_paths_and_names() -> None:
    assert references("`advice/oom.py`, `exporters/registry.EXPORTERS`, `cli/common.add_renamed(parser, new)`, "
                      "`cli/<command>.py`, `planner/trace/`") == [
        ("advice/oom.py", None), ("exporters/registry", "EXPORTERS"), ("cli/common", "add_renamed"),
        ("planner/trace/", None)]
    assert floors_in_the_doc("| 1 | `types.py`, `units.py` | plain |\n| 13 | `report/`, `tui/` | drawing |\n") == [
        ("types", "units"), ("report", "tui")]
