# The two commands of the README:
#   make demo   set up, then a tiny real LoRA fine-tune under `vramscope run`, ending in its summary
#   make test   set up, then the whole test suite
.PHONY: demo test setup lint gpu-test

setup:
	@./scripts/setup.sh

demo: setup
	@mkdir -p out
	.venv/bin/vramscope run --overwrite --log out/demo_memory.csv -- .venv/bin/python examples/train_tiny_lora.py
	.venv/bin/vramscope report out/demo_memory.steps.csv

# pytest-xdist on every core, with half again as many workers as cores (tests/conftest.py: many tests wait on a
# child process or a timer, and another worker uses the core meanwhile); worksteal hands a worker's queued tests
# to an idle one, so the slow process tests (real trainers, pty, signals) do not finish on one worker alone.
# PYTEST_XDIST_AUTO_NUM_WORKERS=N sets the number of workers.
test: setup
	.venv/bin/python -m pytest -q -n auto --dist worksteal

lint: setup
	.venv/bin/ruff check src tests bench examples
	.venv/bin/mypy

gpu-test: setup
	.venv/bin/python -m pytest -q -m gpu
