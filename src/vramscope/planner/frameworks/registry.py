"""The one table of training frameworks and settings styles, filled from the framework modules.

A new framework is one module beside these (its :class:`~vramscope.planner.frameworks.record.Framework`, with
its :class:`~vramscope.planner.frameworks.record.Build`, and a :class:`~vramscope.planner.frameworks.record.Style`
if its users write settings in keys of their own) and its line in :data:`MODULES`. Everything else reads the
table: the memory model, ``--framework``'s choices and help, ``--settings-style``, the advice, the trace, the
real builders (``tune``, ``plan --calibrate``) and the command readers (the framework a program's reading plans
with: :func:`framework_of_program`). :func:`registered` adds one for a while (the tests' way).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from types import ModuleType
from typing import overload

from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks import axolotl, hf, loop, loop_loss, qlora, trl, unsloth
from vramscope.planner.frameworks.record import Framework, Style
from vramscope.recipe import QLoraSpec

# The framework and style modules, in the order ``--framework`` and ``--settings-style`` list them. Each has a
# FRAMEWORK, a STYLE, or both.
MODULES: tuple[ModuleType, ...] = (hf, trl, qlora, unsloth, loop, loop_loss, axolotl)

FRAMEWORK_TABLE: dict[str, Framework] = {}
STYLE_TABLE: dict[str, Style] = {}


class Names(Sequence[str]):
    """The names in a table as they are when read: ``choices=`` of a parser built after a framework was
    registered includes it (a tuple taken at import would not)."""

    def __init__(self, table: Mapping[str, object]) -> None:
        self._table = table

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return tuple(self._table)[index]

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._table))

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) and not isinstance(other, str) else other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


FRAMEWORKS = Names(FRAMEWORK_TABLE)
"""The framework names (``hf``, ``trl``, ``qlora``, ``unsloth``, ``loop``, ``loop-loss``, and any registered)."""
STYLES = Names(STYLE_TABLE)
"""The settings styles' names (``hf``, ``trl``, ``loop``, ``axolotl``, and any registered)."""


def _check(fw: Framework) -> None:
    """A framework names only styles and frameworks the table has."""
    if fw.style not in STYLE_TABLE:
        raise ValueError(f"framework {fw.name!r} names style {fw.style!r}, which is not registered")
    for what, other in (("output_dropped", fw.output_dropped), ("switch_to", fw.switch_to)):
        if other is not None and other not in FRAMEWORK_TABLE:
            raise ValueError(f"framework {fw.name!r}: {what} {other!r} is not registered")
    for program in fw.programs:
        owner = next((o.name for o in FRAMEWORK_TABLE.values() if o is not fw and program in o.programs), None)
        if owner is not None:
            raise ValueError(f"framework {fw.name!r} names program {program!r}, which plans with {owner!r} already")


def register(framework: Framework | None = None, style: Style | None = None) -> None:
    """Add a framework and/or a style to the table.

    Raises:
        ValueError: a name the table has already, or a framework naming a style or framework it has not.
    """
    if style is not None:
        if style.name in STYLE_TABLE:
            raise ValueError(f"style {style.name!r} is registered already")
        STYLE_TABLE[style.name] = style
    if framework is not None:
        if framework.name in FRAMEWORK_TABLE:
            raise ValueError(f"framework {framework.name!r} is registered already")
        FRAMEWORK_TABLE[framework.name] = framework
        try:
            _check(framework)
        except ValueError:
            del FRAMEWORK_TABLE[framework.name]
            raise


@contextlib.contextmanager
def registered(framework: Framework | None = None, style: Style | None = None) -> Iterator[None]:
    """The table with ``framework`` and ``style`` in it, for the ``with`` block (then as before)."""
    register(framework, style)
    try:
        yield
    finally:
        if framework is not None:
            FRAMEWORK_TABLE.pop(framework.name, None)
        if style is not None:
            STYLE_TABLE.pop(style.name, None)


for _module in MODULES:
    if hasattr(_module, "STYLE"):
        STYLE_TABLE[_module.STYLE.name] = _module.STYLE
    if hasattr(_module, "FRAMEWORK"):
        FRAMEWORK_TABLE[_module.FRAMEWORK.name] = _module.FRAMEWORK
for _fw in FRAMEWORK_TABLE.values():  # after all are in: loop names loop-loss, which comes later
    _check(_fw)

HARNESS = loop_loss.FRAMEWORK
"""vramscope's own measurement step (bench/planner_measure.py, tune.qlora, the DDP bench): a loop that
keeps only the loss; the 60-point grid it measured is scored with it."""
TRL_TRAINERS = trl.FRAMEWORK
"""DPO, GRPO, KTO and the reward trainer are TRL's: they plan with its dtypes and fused LM head, whatever
framework the recipe named."""


def framework_named(name: str) -> Framework:
    """The registered :class:`Framework` called ``name``.

    Raises:
        PlanInputError: a framework name the planner does not know.
    """
    try:
        return FRAMEWORK_TABLE[name]
    except KeyError:
        raise PlanInputError(f"unknown framework {name!r}; choose one of {', '.join(FRAMEWORKS)}") from None


def framework_for(spec: QLoraSpec) -> Framework:
    """The :class:`Framework` a recipe names.

    Raises:
        PlanInputError: a framework name the planner does not know.
    """
    return framework_named(spec.framework)


def style_named(name: str) -> Style:
    """The registered :class:`Style` called ``name``.

    Raises:
        PlanInputError: a style the table does not have.
    """
    try:
        return STYLE_TABLE[name]
    except KeyError:
        raise PlanInputError(f"unknown settings style {name!r}; choose one of {', '.join(STYLES)}") from None


def framework_of_program(program: str) -> Framework:
    """The framework a command reader's readings plan with unless the command says more (``Framework.programs``).

    Raises:
        PlanInputError: a program no registered framework names.
    """
    found = next((fw for fw in FRAMEWORK_TABLE.values() if program in fw.programs), None)
    if found is None:
        raise PlanInputError(f"no framework names the program {program!r} in its programs")
    return found


def style_of_program(program: str | None) -> Style | None:
    """The style whose keys a command reader's users write whatever the framework (axolotl's YAML), if any."""
    return next((s for s in STYLE_TABLE.values() if program is not None and program in s.programs), None)


def traced() -> tuple[str, ...]:
    """The frameworks whose step ``plan --trace`` runs."""
    return tuple(name for name, fw in FRAMEWORK_TABLE.items() if fw.build.traced)


def framework_help() -> str:
    """``--framework``'s help: each framework with its summary."""
    listed = ", ".join(f"{name} ({fw.summary})" if fw.summary else name for name, fw in FRAMEWORK_TABLE.items())
    return f"the training program: {listed} (default {QLoraSpec().framework})"
