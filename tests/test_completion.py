"""`vramscope completion` scripts, sourced into a real bash; and "did you mean" for a mistyped subcommand."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def vramscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vramscope", *args], capture_output=True, text=True, timeout=60)


def complete(script: Path, words: list[str]) -> list[str]:
    """What bash offers for ``words`` (the last one being typed), with the script sourced."""
    line = " ".join(words)
    code = (f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
            f"[[ {line!r} == *' ' ]] && COMP_WORDS+=('') && COMP_CWORD={len(words)}; "
            "_vramscope; printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30, check=True)
    return [w for w in out.stdout.splitlines() if w]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_subcommands_and_their_own_flags(tmp_path: Path) -> None:
    made = vramscope("completion", "bash")
    assert made.returncode == 0, made.stderr
    script = tmp_path / "vramscope.bash"
    script.write_text(made.stdout)
    assert "plan" in complete(script, ["vramscope", "pl"])
    flags = complete(script, ["vramscope", "plan", "--gpu"])
    assert "--gpu" in flags and "--gpus" in flags
    assert "--overwrite" in complete(script, ["vramscope", "run", "--over"])
    assert "--overwrite" not in complete(script, ["vramscope", "plan", "--over"])  # plan has no such flag
    assert complete(script, ["vramscope", "run", "--", "python", "--ver"]) == []  # the user's command is theirs


def test_zsh_and_fish_scripts_name_every_subcommand() -> None:
    for shell in ("zsh", "fish"):
        made = vramscope("completion", shell)
        assert made.returncode == 0, made.stderr
        for name in ("watch", "run", "report", "plan", "tune"):
            assert name in made.stdout
    if shutil.which("zsh"):
        check = subprocess.run(["zsh", "-n"], input=vramscope("completion", "zsh").stdout, text=True,
                               capture_output=True, timeout=30)
        assert check.returncode == 0, check.stderr


def test_a_mistyped_subcommand_gets_did_you_mean() -> None:
    out = vramscope("plann", "--model", "Llama-2-7B")
    assert out.returncode == 2
    assert "did you mean 'plan'?" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "did you mean" not in vramscope("xyzzy").stderr

