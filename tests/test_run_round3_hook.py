"""The start-up hook in a child with an interpreter of its own (issue 24, items 2 and 14; the trainer-hook seam).

Real interpreters: a fresh virtualenv (``python -m venv --without-pip``, no vramscope in it) with a
real ``sitecustomize.py`` in its site-packages, and a copy of vramscope in a folder shaped like a
non-editable install's site-packages (other packages beside it).

* An EasyBuild-style sitecustomize that calls ``site.addsitedir`` for a prefix: the prefix's modules
  import under `vramscope run` as without it (item 2).
* The child's ``sys.path`` never gets vramscope's folder; a package beside vramscope there is not
  importable in the child, while the hook still loads vramscope itself from that folder (item 14).
* ``VRAMSCOPE_TRAINER_HOOKS`` names functions called with ``transformers.trainer``; one that fails
  ends the child with 4 and one line; ``run/`` names no caller (the tuner) of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vramscope.run.inject import ENV_TRAINER_HOOKS, PACKAGE_PARENT

PYTHON = sys.executable
SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv of the base interpreter: no vramscope, no transformers, its own site-packages."""
    root = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    return root


def venv_python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def venv_site(venv: Path) -> Path:
    found = subprocess.run([venv_python(venv), "-c", "import site; print(site.getsitepackages()[0])"],
                           capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    return Path(found)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSCOPE_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def cli(package_home: Path = SRC) -> list[str]:
    """`vramscope` found by its interpreter's sys.path, as an installed one is: no PYTHONPATH for the child."""
    code = (f"import sys; sys.path.insert(0, {str(package_home)!r}); from vramscope.cli import main; "
            "raise SystemExit(main(sys.argv[1:]))")
    return [PYTHON, "-c", code]


def vramscope_run(args: list[str], cwd: Path, package_home: Path = SRC,
                  **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cli(package_home), "run", "--quiet", "--", *args], cwd=cwd, env=clean_env(**extra),
                          capture_output=True, text=True, timeout=120)


# -- 2. the shadowed sitecustomize's sys.path changes stay ----------------------------------------------

EASYBUILD_SITECUSTOMIZE = textwrap.dedent(
    """
    # As EasyBuild's: every prefix named in the environment gets its site folder (with its .pth files).
    import os, site
    for prefix in filter(None, os.environ.get("EB_PYTHONPATH_PREFIXES", "").split(os.pathsep)):
        site.addsitedir(os.path.join(prefix, "lib", "site-packages"))
    """
)


def test_a_shadowed_sitecustomizes_addsitedir_is_kept(venv: Path, tmp_path: Path) -> None:
    (venv_site(venv) / "sitecustomize.py").write_text(EASYBUILD_SITECUSTOMIZE)
    prefix_site = tmp_path / "prefix" / "lib" / "site-packages"
    (prefix_site / "ebpkg").mkdir(parents=True)
    (prefix_site / "ebpkg" / "__init__.py").write_text("VALUE = 'from the prefix'\n")
    (prefix_site / "extra.pth").write_text(str(tmp_path / "viapth") + "\n")  # a .pth inside the prefix too
    (tmp_path / "viapth").mkdir()
    (tmp_path / "viapth" / "pthmod.py").write_text("VALUE = 'via pth'\n")
    script = tmp_path / "t.py"
    script.write_text("import json, sys, ebpkg, pthmod\nprint(json.dumps([ebpkg.VALUE, pthmod.VALUE, sys.path]))\n")
    env_extra = {"EB_PYTHONPATH_PREFIXES": str(tmp_path / "prefix")}
    plain = subprocess.run([venv_python(venv), str(script)], env=clean_env(**env_extra), capture_output=True,
                           text=True, timeout=60)
    under = vramscope_run([venv_python(venv), str(script)], cwd=tmp_path, **env_extra)
    assert plain.returncode == 0, plain.stderr
    assert under.returncode == 0, under.stderr  # was: ModuleNotFoundError: No module named 'ebpkg'
    mine, theirs = json.loads(plain.stdout), json.loads(under.stdout)
    assert theirs[:2] == mine[:2] == ["from the prefix", "via pth"]
    from vramscope.run.inject import SITE_DIR

    assert [p for p in theirs[2] if p != SITE_DIR] == mine[2]  # every entry, in the same order


# -- 14. only the hook is visible to a child's own interpreter ------------------------------------------

FAKE_TRAINER = textwrap.dedent(
    """
    class _Handler:
        def __init__(self):
            self.callbacks = []

    class Trainer:
        def __init__(self):
            self.callback_handler = _Handler()
    """
)
PROBE = textwrap.dedent(
    """
    import json, sys
    import transformers.trainer as t
    t.Trainer()                       # the hook imports vramscope here, to attach its callback
    try:
        import leaky                  # a package beside vramscope in its site-packages
        leaked = True
    except ImportError:
        leaked = False
    inject = sys.modules.get("vramscope.run.inject")
    print(json.dumps({"path": sys.path, "leaked": leaked, "inject": getattr(inject, "__file__", None)}))
    """
)


def test_a_childs_own_interpreter_gets_vramscope_but_not_its_folder(venv: Path, tmp_path: Path) -> None:
    # vramscope as a non-editable install sees it: one site-packages, other packages beside it.
    installed = tmp_path / "site-packages"
    shutil.copytree(SRC / "vramscope", installed / "vramscope", ignore=shutil.ignore_patterns("__pycache__"))
    (installed / "leaky.py").write_text("WHAT = 'a package of vramscope\\'s interpreter'\n")
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text("")
    (tmp_path / "transformers" / "trainer.py").write_text(FAKE_TRAINER)
    (tmp_path / "probe.py").write_text(PROBE)
    result = vramscope_run([venv_python(venv), "probe.py"], cwd=tmp_path, package_home=installed)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert str(installed) not in seen["path"] and str(installed.resolve()) not in seen["path"]
    assert seen["leaked"] is False  # was: importable, with everything else of that site-packages
    # The hook did load vramscope, from the copy that started it, through its one-package finder.
    assert seen["inject"] == str((installed / "vramscope" / "run" / "inject.py").resolve())


def test_the_package_parent_names_the_folder_that_holds_vramscope() -> None:
    assert (Path(PACKAGE_PARENT) / "vramscope" / "run" / "inject.py").is_file()


# -- the trainer-hook seam -------------------------------------------------------------------------------

def _trainer_hook_child(tmp_path: Path, hooks: str) -> subprocess.CompletedProcess[str]:
    from vramscope.run.inject import child_env

    (tmp_path / "transformers").mkdir(exist_ok=True)
    (tmp_path / "transformers" / "__init__.py").write_text("")
    (tmp_path / "transformers" / "trainer.py").write_text(FAKE_TRAINER)
    (tmp_path / "myhooks.py").write_text(textwrap.dedent(
        """
        import pathlib
        def mark(module):
            pathlib.Path("marked").write_text(module.__name__)
        def broken(module):
            raise RuntimeError("the protocol failed")
        """
    ))
    base = clean_env(PYTHONPATH=f"{SRC}{os.pathsep}{tmp_path}")
    env = {**base, **child_env(None, environ=base), ENV_TRAINER_HOOKS: hooks}
    env.pop("VRAMSCOPE_INJECT")  # a hook alone (as a tune trial has it) installs the import hook too
    return subprocess.run([PYTHON, "-c", "import transformers.trainer; print('went on')"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def test_trainer_hooks_named_in_the_environment_are_called_with_the_trainer_module(tmp_path: Path) -> None:
    result = _trainer_hook_child(tmp_path, "myhooks:mark")
    assert result.returncode == 0 and result.stdout == "went on\n", result.stderr
    assert (tmp_path / "marked").read_text() == "transformers.trainer"


def test_a_failing_trainer_hook_ends_the_child_with_4_and_one_line(tmp_path: Path) -> None:
    result = _trainer_hook_child(tmp_path, "myhooks:broken")
    assert result.returncode == 4 and result.stdout == ""  # the training itself never ran
    assert result.stderr.strip().splitlines() == [
        "vramscope: could not run the trainer hook myhooks:broken: RuntimeError: the protocol failed"]


def test_run_names_no_tuner() -> None:
    run_dir = SRC / "vramscope" / "run"
    for path in run_dir.rglob("*.py"):
        assert "vramscope.tune" not in path.read_text(), path  # tune/ imports run/, never the other way
