"""The house has one direction: no import cycles between vramscope's modules, each package on its floor importing
only the floors below (:data:`FLOORS`, :data:`ALLOWED`: the table ARCHITECTURE.md points at), and what analyses or
draws never reads a backend.

Every import counts, also those deferred into functions (a cycle that only bites at call time is still a
cycle); imports under ``if TYPE_CHECKING:`` do not, as they never run. ruff's banned-api rules
(pyproject.toml) keep the libraries in their places; this test sees what ruff cannot: deferred imports
and cycles.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "vramscope"

# Cycles between files that were being rebuilt on other branches when this test was written (issue 15);
# each entry is to be removed once its cycle is gone, and no new entry is to be added.
KNOWN_CYCLES: set[frozenset[str]] = set()

# What may never import vramscope.backends, not even inside a function.
NO_BACKENDS = ("vramscope.analysis", "vramscope.report", "vramscope.tui", "vramscope.output")

# Each library in its place (a module name, or a package name ending in "."): the core stays light, and a
# newcomer finds the NVML code in backends/nvml.py. ruff's banned-api (pyproject.toml) says the same but can only
# allow all banned libraries in a file at once; this checks each library, deferred imports included.
LIBRARY_PLACES: dict[str, tuple[str, ...]] = {
    "pynvml": ("vramscope.backends.nvml",),
    "psutil": ("vramscope.backends.host",),
    "prometheus_client": ("vramscope.exporters.collector", "vramscope.exporters.http", "vramscope.exporters.push"),
    "yaml": ("vramscope.commands.files",),
    "pyarrow": ("vramscope.logs.", "vramscope.dataset.readers"),  # the log readers; the user's data
    "tokenizers": ("vramscope.dataset.tokenizer",),
    "torch": (
        "vramscope.backends.torch_allocator",
        "vramscope.training.",  # the monitor inside the run (strategy.py reads torch.distributed)
        "vramscope.tune.",  # the tuner: its trials, the QLoRA builders, the trial child, calibration
        "vramscope.oom.recorder",  # records torch's allocator history, inside the training
        "vramscope.planner.trace.engine",
        "vramscope.planner.trace.counter",
        "vramscope.planner.trace.standins",
        "vramscope.planner.trace.autocast",  # CUDA's autocast policy on the trace's CPU tensors
    ),
}
# Modules that import torch outside its places today, each to leave this list when its floor is rebuilt
# (issue 15: the tuner and its CLI -> tune/, where they may), by hand as KNOWN_CYCLES; no new entry is to be added.
TORCH_NOT_YET_IN_PLACE: set[str] = set()  # tune/ took the tuner and its CLI's torch (issue 15)


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if "_sitecustomize" in parts:  # copied into the child's path, imported there as a top-level module
            continue
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes that sit under ``if TYPE_CHECKING:``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for inner in node.body:
                    skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def _imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name ``name`` imports (a module, or a module's attribute), anywhere in its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.update(f"{module}.{alias.name}" for alias in node.names)  # a submodule when it is one
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its body."""
    out: set[str] = set()
    for target in _imported_names(name, path):
        # The longest prefix that is one of our modules: "vramscope.oom.classify.oom_kind" -> vramscope.oom.classify.
        parts = target.split(".")
        while parts:
            candidate = ".".join(parts)
            if candidate in known:
                if candidate != name:
                    out.add(candidate)
                break
            parts.pop()
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_graph_is_read() -> None:
    edges = graph()
    # A few arrows that must be seen, deferred ones included, or the test below would pass vacuously.
    assert "vramscope.oom.classify" in edges["vramscope.tune.trials"]
    assert "vramscope.oom" in edges["vramscope.training.readers"]  # inside a function
    assert "vramscope.planner.batching" in edges["vramscope.advice.oom"]
    assert "vramscope.types" in edges["vramscope.logs.schema"]


def test_no_import_cycles() -> None:
    found = [sorted(c) for c in cycles(graph()) if c not in KNOWN_CYCLES]
    assert not found, f"import cycles (deferred imports count too): {found}"


def test_the_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_analysis_report_and_tui_never_read_a_backend() -> None:
    bad = {
        name: sorted(t for t in targets if t.startswith("vramscope.backends"))
        for name, targets in graph().items()
        if name.startswith(NO_BACKENDS)
    }
    assert not {k: v for k, v in bad.items() if v}


def _in_place(module: str, places: tuple[str, ...]) -> bool:
    return any(module.startswith(p) if p.endswith(".") else module == p for p in places)


def library_users() -> dict[str, set[str]]:
    """library -> the package's modules that import it (deferred imports too)."""
    users: dict[str, set[str]] = {library: set() for library in LIBRARY_PLACES}
    for name, path in modules().items():
        for target in _imported_names(name, path):
            top = target.split(".")[0]
            if top in users:
                users[top].add(name)
    return users


def test_each_library_is_imported_only_in_its_places() -> None:
    users = library_users()
    assert "vramscope.backends.nvml" in users["pynvml"] and "vramscope.tune.qlora" in users["torch"]  # seen
    misplaced = {
        library: sorted(m for m in found if not _in_place(m, LIBRARY_PLACES[library]))
        for library, found in users.items()
    }
    misplaced["torch"] = [m for m in misplaced["torch"] if m not in TORCH_NOT_YET_IN_PLACE]
    assert not {k: v for k, v in misplaced.items() if v}, f"libraries imported outside their places: {misplaced}"


def test_the_light_floors_never_import_torch_not_even_through_vramscope() -> None:
    """What reads a log, samples or plans must stay light: no path of imports from it reaches torch."""
    edges = graph()
    torch_users = library_users()["torch"]
    light = [m for m in edges if m.startswith(("vramscope.sampling", "vramscope.analysis", "vramscope.report",
                                                "vramscope.output", "vramscope.tui"))]
    assert light
    heavy: dict[str, list[str]] = {}
    for start in light:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        if seen & torch_users:
            heavy[start] = sorted(seen & torch_users)
    assert not heavy, f"these reach a module that imports torch: {heavy}"


# -- the floors: the direction between packages --------------------------------------------------------------------

# The house's floors, bottom first. A package imports only packages on floors below its own (the bottom floor's
# modules may also import each other); ARCHITECTURE.md points here. A new package takes a floor here and a row in
# ALLOWED; a new import between packages takes an entry in its row, which must point down.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("types", "units", "recipe", "trainers"),  # plain data and the Sink protocol: importing nothing above
    ("backends",),  # NVML, the host, torch's allocator: where readings come from
    ("sampling",),  # the sampler and its peaks
    ("logs",),  # the log's schema, its writers (sinks) and readers
    ("exporters",),  # Prometheus: the collector, /metrics, the Pushgateway
    ("output",),  # files written whole, the names beside a log, text made safe
    ("dataset",),  # the user's data: files, tokens as the trainer makes them, the longest batch (for the planner)
    ("analysis",),  # typed results: a log's analysis, an OOM snapshot's facts
    ("planner",),  # the analytic memory model and the trace
    ("commands",),  # reading a pasted training command
    ("advice",),  # the one Advice type and its rules: over a log's analysis, an OOM's facts, a plan
    ("oom",),  # the post-mortem: recorded at the OOM, composed with its advice, drawn
    ("report", "tui"),  # drawing a log's analysis (terminal, HTML, JSON); the live dashboard
    ("training",),  # the in-process MemoryMonitor
    ("integrations",),  # the HF, Lightning and loop callbacks
    ("run",),  # `vramscope run`: the runner, the injection, the child's start-up hook
    ("tune",),  # the tuner: it starts its trial children through run
    ("cli",),  # thin: parses, calls one floor down, prints
)

# What each package imports, and nothing else (deferred imports count; ``if TYPE_CHECKING:`` ones do not).
# The package root (``vramscope/__init__``: the lazy public API) and ``__main__`` are the facade and may name
# anything; any package may import the root itself (for ``__version__``), as it eagerly imports only the bottom floor
# (checked below).
ALLOWED: dict[str, frozenset[str]] = {
    "types": frozenset({"units"}),
    "units": frozenset(),
    "recipe": frozenset(),
    "trainers": frozenset(),
    "backends": frozenset({"types"}),
    "sampling": frozenset({"backends", "types"}),
    "logs": frozenset({"types", "units"}),
    "exporters": frozenset({"types"}),
    "output": frozenset(),
    "dataset": frozenset({"trainers"}),  # how each trainer reads a dataset
    "analysis": frozenset({"logs", "output", "sampling", "units"}),
    "planner": frozenset({"logs", "recipe", "trainers", "units"}),
    "commands": frozenset({"logs", "planner", "recipe", "trainers"}),  # logs: the one bounded reading of a file
    "advice": frozenset({"analysis", "planner", "recipe", "units"}),
    "oom": frozenset({"advice", "analysis", "output", "types", "units"}),
    "report": frozenset({"advice", "analysis", "logs", "output", "planner", "types", "units"}),  # planner: --plan
    "tui": frozenset({"logs", "output", "types", "units"}),
    "training": frozenset({"analysis", "backends", "exporters", "logs", "oom", "output", "sampling", "types", "units"}),
    "integrations": frozenset({"training"}),
    "run": frozenset({"backends", "exporters", "integrations", "logs", "output", "sampling", "types"}),
    "tune": frozenset({"backends", "commands", "oom", "output", "planner", "recipe", "run", "sampling", "training",
                       "units"}),
    "cli": frozenset({"advice", "backends", "commands", "dataset", "exporters", "logs", "oom", "output", "planner",
                      "recipe", "report", "run", "sampling", "trainers", "tui", "tune", "types", "units"}),
}

# Imports against the direction that exist today, each with the change that removes it; an entry leaves this table
# when its import goes (a test below fails until it does), and no new entry is to be added.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

FACADE = "(facade)"  # vramscope/__init__.py and vramscope/__main__.py
HOOK = SRC / PACKAGE / "run" / "_sitecustomize" / "sitecustomize.py"  # run's, though imported as a top-level module


def package_of(module: str) -> str:
    """``vramscope.oom.recorder`` -> ``oom``; ``vramscope.types`` -> ``types``; the root and __main__: the facade."""
    parts = module.split(".")
    return FACADE if len(parts) == 1 or parts[1] == "__main__" else parts[1]


def package_imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the module-level imports behind it, ``"a.b -> c.d"``."""
    known = modules()
    edges = {name: imports_of(name, path, known) for name, path in known.items()}
    edges["vramscope.run._sitecustomize.sitecustomize"] = imports_of("vramscope.run._sitecustomize.sitecustomize",
                                                                     HOOK, known)
    found: dict[tuple[str, str], list[str]] = {}
    for name, targets in edges.items():
        for target in targets:
            pair = (package_of(name), package_of(target))
            if pair[0] != pair[1]:
                found.setdefault(pair, []).append(f"{name} -> {target}")
    return found


def _floor(package: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if package in floor)


def test_the_package_graph_is_read() -> None:
    found = package_imports()
    assert ("oom", "advice") in found and ("tune", "run") in found and ("cli", "tune") in found
    assert ("training", "oom") in found  # deferred, inside a function
    assert ("report", FACADE) in found  # report/html.py reads __version__


def test_every_package_has_a_floor_and_a_row() -> None:
    on_disk = {package_of(name) for name in modules()} - {FACADE}
    placed = [p for floor in FLOORS for p in floor]
    assert len(placed) == len(set(placed)), "a package on two floors"
    assert set(placed) == on_disk == set(ALLOWED), (
        f"packages without a floor: {sorted(on_disk - set(placed))}; floors without a package: "
        f"{sorted(set(placed) - on_disk)}; rows of ALLOWED that differ: {sorted(set(ALLOWED) ^ on_disk)}")


def test_the_table_points_down() -> None:
    bottom = set(FLOORS[0])
    up = sorted((a, b) for a, row in ALLOWED.items() for b in row
                if not (_floor(b) < _floor(a) or {a, b} <= bottom))
    assert not up, f"ALLOWED lets these import a floor not below their own: {up}"


def test_each_package_imports_only_what_the_table_allows() -> None:
    bad = {f"{a} -> {b}": sorted(why)[:3] for (a, b), why in package_imports().items()
           if a != FACADE and b != FACADE and b not in ALLOWED[a] and (a, b) not in KNOWN_UPWARD}
    assert not bad, f"imports between packages that tests/test_layering.py's ALLOWED does not list: {bad}"


def test_the_known_upward_imports_are_still_there() -> None:
    gone = sorted(f"{a} -> {b}" for a, b in KNOWN_UPWARD if (a, b) not in package_imports())
    assert not gone, f"fixed: remove them from KNOWN_UPWARD: {gone}"


def test_no_package_cycles() -> None:
    graph_: dict[str, set[str]] = {}
    for a, b in package_imports():
        if FACADE not in (a, b):
            graph_.setdefault(a, set()).add(b)
    known = {frozenset(pair) for pair in KNOWN_UPWARD}
    found = [sorted(c) for c in cycles(graph_) if c not in known]
    assert not found, f"packages that import each other, around: {found}"


def test_the_facade_eagerly_imports_only_the_bottom_floor() -> None:
    # What makes `from vramscope import __version__` safe on any floor: the root names the rest lazily.
    root = SRC / PACKAGE / "__init__.py"
    eager = {package_of(t) for t in imports_of(PACKAGE, root, modules())}
    assert eager <= set(FLOORS[0]), f"vramscope/__init__.py imports {sorted(eager - set(FLOORS[0]))} eagerly"
