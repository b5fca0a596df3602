# Quick start: `make demo` runs the quick-start notebook; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The dev setup pins torch to a CPU build; pyproject.toml keeps a normal range for users.
TORCH_PIN := torch==2.13.0

.PHONY: setup demo test bench clean

$(BIN)/.nb_accel-installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_PIN)
	$(BIN)/python -m pip install --quiet -e ".[test,examples]"
	touch $@

setup: $(BIN)/.nb_accel-installed

demo: setup
	$(BIN)/python tools/run_notebook.py notebooks/quickstart.ipynb

test: setup
	$(BIN)/python -m pytest

# Accelerate is only a comparison row; the torch pin keeps pip from replacing the CPU build.
bench: setup
	$(BIN)/python -m pip install --quiet accelerate $(TORCH_PIN)
	$(BIN)/python benchmarks/launch.py
	$(BIN)/python benchmarks/interrupt.py
	$(BIN)/python benchmarks/loader.py
	$(BIN)/python benchmarks/step.py
	$(BIN)/python benchmarks/progress.py
	$(BIN)/python benchmarks/magic.py

clean:
	rm -rf $(VENV) build *.egg-info
