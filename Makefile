# The two commands of the README:
#   make demo   set up, then a tiny real LoRA fine-tune under `vramscope run`, ending in its summary
#   make test   set up, then the whole test suite
.PHONY: demo test setup bytecode lint gpu-test

setup:
	@./scripts/setup.sh

# The project's own bytecode, written before a run: where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) Python would otherwise compile vramscope's modules again in every test worker and in each of the
# hundreds of child Pythons the tests start (measured on the CLI tests: a quarter of their CPU time).
# compileall rewrites only what changed; __pycache__ is ignored by git.
bytecode: setup
	@.venv/bin/python -m compileall -qq -j0 src tests bench examples || true

demo: bytecode
	@mkdir -p out
	.venv/bin/vramscope run --overwrite --log out/demo_memory.csv -- .venv/bin/python examples/train_tiny_lora.py
	.venv/bin/vramscope report out/demo_memory.steps.csv

# pytest-xdist on every core, with half again as many workers as cores (tests/conftest.py: many tests wait on a
# child process or a timer, and another worker uses the core meanwhile); worksteal hands a worker's queued tests
# to an idle one, so the slow process tests (real trainers, pty, signals) do not finish on one worker alone.
# PYTEST_XDIST_AUTO_NUM_WORKERS=N sets the number of workers.
test: bytecode
	.venv/bin/python -m pytest -q -n auto --dist worksteal

lint: setup
	.venv/bin/ruff check src tests bench examples
	.venv/bin/mypy

gpu-test: bytecode
	.venv/bin/python -m pytest -q -m gpu
