"""`import vramscope` needs no GPU, no driver, no torch, and stays light."""

from __future__ import annotations

import subprocess
import sys

BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {BLOCKED}:
            raise ImportError(f'{name} is blocked for this test')
        return None
sys.meta_path.insert(0, Block())
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_import_without_torch_or_nvml() -> None:
    code = BLOCKER.replace("{BLOCKED}", "{'torch', 'pynvml', 'transformers', 'numpy', 'matplotlib'}") + (
        "import vramscope\n"
        "from vramscope.backends.nvml import NvmlBackend\n"
        "b = NvmlBackend()\n"
        "print(b.read(), b.init_error)\n"
        "from vramscope.cli import build_parser\n"
        "build_parser()\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "() nvidia-ml-py is not installed" in result.stdout


def test_import_does_not_pull_heavy_libraries() -> None:
    result = run_python(
        "import sys, vramscope, vramscope.cli\n"
        "heavy = ('torch', 'transformers', 'matplotlib', 'numpy', 'prometheus_client')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_lazy_public_names_resolve() -> None:
    import vramscope

    assert vramscope.Sampler is not None and vramscope.__version__
    result = run_python("import vramscope; vramscope.no_such_name")
    assert "has no attribute 'no_such_name'" in result.stderr


def test_python_dash_m_and_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vramscope", "--version"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert result.stdout.startswith("vramscope ")


def test_reading_a_log_and_planning_need_no_psutil_nvml_or_torch() -> None:
    # A laptop without a GPU reads logs copied off a cluster and plans runs: nothing of the monitor loads.
    code = BLOCKER.replace("{BLOCKED}", "{'torch', 'pynvml', 'psutil', 'transformers', 'matplotlib'}") + (
        "import glob, vramscope\n"
        "from vramscope.report.load import report_file\n"
        "report = report_file(sorted(glob.glob('tests/data/traces/cpu/*.csv'))[0])\n"
        "print(report.result.rows > 0, vramscope.plan('Llama-2-7B', 1, 512).peak_allocated_bytes > 0)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
