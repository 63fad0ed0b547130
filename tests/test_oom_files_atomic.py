"""The OOM post-mortem's files are written whole or not at all.

The recorder rewrites ``oom-N.md/.html/.json`` when the OOM's message arrives; a full disk at that moment must leave
the first, good report in place (it used ``Path.write_text``, which truncates first). The full disk is real: a child
process whose files may not grow past a few bytes (RLIMIT_FSIZE, so writes fail with EFBIG as on a full disk).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.test_oom import event, make_snapshot  # the scenario fixtures of the OOM tests

SRC = str(Path(__file__).resolve().parent.parent / "src")
ROOT = str(Path(__file__).resolve().parent.parent)

REWRITE = textwrap.dedent(
    """
    import resource, signal, sys
    from vramscope.oom.render import write_report
    from vramscope.oom.postmortem import post_mortem
    from tests.test_oom import event, make_snapshot

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
    report = post_mortem(make_snapshot(), event(), snapshot_file="again.pickle")
    try:
        write_report(report, sys.argv[1], "oom-1")
    except OSError as exc:
        print("refused:", exc.strerror)
    """
)


@pytest.mark.slow  # a child Python with torch
def test_a_full_disk_keeps_the_first_report(tmp_path: Path) -> None:
    from vramscope.oom.postmortem import post_mortem
    from vramscope.oom.render import write_report

    first = write_report(post_mortem(make_snapshot(), event(), snapshot_file="first.pickle"), tmp_path, "oom-1")
    before = {kind: path.read_bytes() for kind, path in first.items()}
    assert all(len(data) > 200 for data in before.values())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", REWRITE, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: File too large")
    assert {kind: path.read_bytes() for kind, path in first.items()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["oom-1.html", "oom-1.json", "oom-1.md"]  # no temp left
