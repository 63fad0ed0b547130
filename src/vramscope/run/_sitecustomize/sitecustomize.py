"""vramscope's start-up hook for the programs that ``vramscope run`` starts (not imported otherwise).

``vramscope run`` puts this folder first on ``PYTHONPATH``, so every Python process of the command runs
this file at start-up. It does three small things and nothing else:

1. runs the ``sitecustomize`` this file shadows, if there is one (a distribution's, a virtualenv's,
   one on the user's own ``PYTHONPATH``), so that nothing the user had is lost: every change it makes to
   ``sys.path`` (EasyBuild's ``site.addsitedir`` per prefix) is kept;
2. adds an import hook that waits for ``transformers.trainer`` (and Lightning's trainer module); a
   program that imports neither pays one dictionary miss per import and nothing else;
3. when that module is loaded, wraps ``Trainer.__init__`` so that every Trainer (and subclass, such
   as TRL's) gets vramscope's memory callback, via ``vramscope.run.inject.attach``
   (``attach_lightning`` for a Lightning Trainer); and it calls each "trainer hook" that
   ``VRAMSCOPE_TRAINER_HOOKS`` names (``module:function,...``) with the ``transformers.trainer`` module
   (``vramscope tune -- CMD`` names its trial there: this hook knows nothing of the tuner).

vramscope itself is imported from the copy that started the program only when the program's own
interpreter has none, and then through a finder that answers for the ``vramscope`` package alone:
the folder it lives in (for an installed copy, a whole site-packages) never goes on ``sys.path``.

Before all of it, it calls the start-up hooks ``VRAMSCOPE_START_HOOKS`` names (``module:function,...``),
before the program's own code runs (``vramscope tune --gpus N`` installs its fake process group there).

Standard library only, and every failure is one line on stderr (dropped when stderr is closed): a
monitor must never stop a training.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_TARGET = "transformers.trainer"
# The modules whose Trainer gets the callback -> the function of vramscope.run.inject that adds it
# (Lightning's Trainer lives in the unified package and in the older standalone one).
_TARGETS = {
    _TARGET: "attach",
    "lightning.pytorch.trainer.trainer": "attach_lightning",
    "pytorch_lightning.trainer.trainer": "attach_lightning",
}


def _say(message: str) -> None:
    stream = sys.stderr
    if stream is None:  # stderr closed (2>&-): print(file=None) would write to the program's stdout
        return
    try:
        print(f"vramscope: {message}", file=stream)
    except Exception:  # stderr broken: stay silent
        pass


def _is_here(entry: str) -> bool:
    try:
        return os.path.abspath(entry or os.curdir) == _HERE
    except Exception:  # a path entry that is not a string
        return False


def _run_shadowed_sitecustomize() -> None:
    """Import the next ``sitecustomize`` on sys.path, as Python would have without this folder.

    What it does to ``sys.path`` stays (an EasyBuild-style ``site.addsitedir`` for each prefix);
    this folder goes back where it was, before the entry that followed it.
    """
    ours = sys.modules.pop("sitecustomize", None)
    where = [i for i, p in enumerate(sys.path) if _is_here(p)]
    spelled = sys.path[where[0]] if where else _HERE
    after = sys.path[where[0] + 1] if where and where[0] + 1 < len(sys.path) else None
    sys.path[:] = [p for p in sys.path if not _is_here(p)]
    try:
        import sitecustomize  # noqa: F401  (the shadowed one, if any)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _say(f"the sitecustomize module this one wraps failed: {exc}")
    except Exception as exc:  # site.py would report it the same way and go on
        _say(f"the sitecustomize module this one wraps failed: {type(exc).__name__}: {exc}")
    finally:
        path = sys.path  # the shadowed one may have bound a new list
        if where and not any(_is_here(p) for p in path):
            at = path.index(after) if after is not None and after in path else min(where[0], len(path))
            path.insert(at, spelled)
        if ours is not None and "sitecustomize" not in sys.modules:
            sys.modules["sitecustomize"] = ours


class _OnePackageFinder(importlib.abc.MetaPathFinder):
    """Finds the top-level ``vramscope`` package in one folder, and nothing else from that folder.

    Its modules are then found through the package's own ``__path__``; the folder is never on
    ``sys.path``, so the program's other imports (torch, numpy) come from its own interpreter.
    """

    def __init__(self, folder: str) -> None:
        self._folder = folder

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "vramscope":
            return None
        return importlib.machinery.PathFinder.find_spec(name, [self._folder])


def _import_vramscope(name: str, prefer_ours: bool = False) -> ModuleType:
    """Import ``name`` (a module of vramscope): the program's own vramscope if it has one, else ours.

    ``prefer_ours``: the copy that started this process first, when the program has not imported
    vramscope yet (a protocol between the two, as a tune trial's, must be one version).
    """
    folder = os.environ.get("VRAMSCOPE_PACKAGE_PARENT")
    if not prefer_ours or "vramscope" in sys.modules or not folder:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            if exc.name != "vramscope" or not folder:
                raise
    assert folder is not None
    finder = _OnePackageFinder(folder)
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module(name)
    finally:  # vramscope is in sys.modules now (or could not be loaded): the finder has done its work
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


def _attach_to_trainers(module: ModuleType, attach_name: str = "attach") -> None:
    trainer_cls = getattr(module, "Trainer", None)
    if trainer_cls is None or getattr(trainer_cls.__init__, "_vramscope_wrapped", False):
        return
    original = trainer_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if getattr(self, "_vramscope_seen", False):  # a subclass's __init__ chain passes here once
            return
        self._vramscope_seen = True
        attach = _load_attach(attach_name)
        if attach is not None:
            try:
                attach(self)
            except Exception as exc:
                _say(f"could not attach the memory callback to {type(self).__name__}: {type(exc).__name__}: {exc}")

    __init__._vramscope_wrapped = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__doc__ = original.__doc__
    trainer_cls.__init__ = __init__


def _load_attach(name: str = "attach") -> Any:
    try:
        inject = _import_vramscope("vramscope.run.inject")
    except Exception as exc:
        _say(f"not attaching the memory callback: vramscope cannot be imported here ({exc})")
        return None
    attach = getattr(inject, name, None)
    if attach is None:  # an older vramscope on the child's path: it has no such hook
        _say(f"not attaching the memory callback: this vramscope has no {name}()")
    return attach


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then wraps the Trainer."""

    def __init__(self, real: Any, attach_name: str = "attach") -> None:
        self._real = real
        self._attach_name = attach_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._real.exec_module(module)
        try:
            if os.environ.get("VRAMSCOPE_INJECT") == "1":
                _attach_to_trainers(module, self._attach_name)
        except Exception as exc:
            _say(f"could not hook {module.__name__}.Trainer: {type(exc).__name__}: {exc}")
        if module.__name__ == _TARGET:
            _run_trainer_hooks(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._real, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Waits for the trainer modules; answers None (not mine) for every other module."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _TARGETS or self._busy:
            return None
        self._busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _Loader(spec.loader, _TARGETS[name])
                    return spec
            return None
        finally:
            self._busy = False


def _trainer_hooks() -> list[str]:
    return [h.strip() for h in os.environ.get("VRAMSCOPE_TRAINER_HOOKS", "").split(",") if h.strip()]


def _run_trainer_hooks(module: ModuleType) -> None:
    """Call each ``module:function`` of ``VRAMSCOPE_TRAINER_HOOKS`` with ``transformers.trainer``.

    A hook is the protocol of whoever set the variable (``vramscope tune`` runs its trial through one):
    a child that cannot run it must not go on to run the whole training instead, so it exits with 4.
    """
    for hook in _trainer_hooks():
        module_name, _, function_name = hook.partition(":")
        try:
            function = getattr(_import_vramscope(module_name, prefer_ours=True), function_name or "install")
            function(module)
        except Exception as exc:
            _say(f"could not run the trainer hook {hook}: {type(exc).__name__}: {exc}")
            if sys.stderr is not None:
                sys.stderr.flush()
            os._exit(4)


def _run_start_hooks() -> None:
    """Call each ``module:function`` of ``VRAMSCOPE_START_HOOKS`` now, before the program's own code runs
    (``vramscope tune --gpus N`` names its fake process group there: this hook knows nothing of the tuner).

    The caller's protocol, so the copy of vramscope that set the variable; a child that cannot run a hook
    must not go on without it (a rehearsal would wait for ranks that never come), so it exits with 4.
    """
    hooks = [h.strip() for h in os.environ.get("VRAMSCOPE_START_HOOKS", "").split(",") if h.strip()]
    for hook in hooks:
        module_name, _, function_name = hook.partition(":")
        try:
            getattr(_import_vramscope(module_name, prefer_ours=True), function_name or "install")()
        except Exception as exc:
            _say(f"could not run the start-up hook {hook}: {type(exc).__name__}: {exc}")
            if sys.stderr is not None:
                sys.stderr.flush()
            os._exit(4)


def _install() -> None:
    _run_start_hooks()
    if os.environ.get("VRAMSCOPE_INJECT") != "1" and not _trainer_hooks():
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name, attach_name in _TARGETS.items():
        already = sys.modules.get(name)
        if already is not None:  # imported before us (unusual): patch it directly
            if os.environ.get("VRAMSCOPE_INJECT") == "1":
                _attach_to_trainers(already, attach_name)
            if name == _TARGET:
                _run_trainer_hooks(already)


_run_shadowed_sitecustomize()
try:
    _install()
except Exception as _exc:  # never break the program's start-up
    _say(f"start-up hook failed: {_exc}")
