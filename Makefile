# Quick start: `make demo` runs the quick-start notebook; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The dev setup pins torch to a CPU build; pyproject.toml keeps a normal range for users.
TORCH_PIN := torch==2.13.0
# The Accelerate release the compatibility lane runs the tests of (and the benchmarks compare with).
ACCELERATE_PIN := accelerate==1.15.0
# The Transformers release the Trainer's tests run (Colab's lanes take Colab's own).
TRANSFORMERS_PIN := transformers==5.24.0

.PHONY: setup test-setup hosts-setup trackers-env demo lab docs test test-serial test-docs test-chaos test-install lint test-accelerate test-xla test-trackers ray-env test-ray \
	test-browser test-colab test-colab-units test-colab-kernels test-kaggle test-classic chromium \
	screenshots bench clean

# What the notebooks need (make demo, make lab): the package and its notebook extra.
$(BIN)/.nb_accel-installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_PIN)
	$(BIN)/python -m pip install --quiet -e ".[examples]" $(TORCH_PIN)
	touch $@

# What the tests add (Transformers, Accelerate, the trackers, mypy, pandas, ...). Accelerate and
# Transformers are pinned like torch: the tests compare nb_accel's names with that Accelerate's,
# and a new release of either is taken on purpose, never by a fresh setup.
$(BIN)/.nb_accel-test-installed: $(BIN)/.nb_accel-installed
	$(BIN)/python -m pip install --quiet -e ".[test,examples]" $(TORCH_PIN) $(ACCELERATE_PIN) \
		$(TRANSFORMERS_PIN)
	touch $@

setup: $(BIN)/.nb_accel-installed

test-setup: $(BIN)/.nb_accel-test-installed

demo: setup
	$(BIN)/python tools/run_notebook.py notebooks/quickstart.ipynb

# The tests that make fresh virtual environments (the wheel alone, under Colab's and Kaggle's
# package lists, Binder's files) are a lane of their own: make test-install; the linters (ruff,
# mypy) are make lint. The suite runs as two halves at once (tools/at_once.py), each a pytest
# of its own (--suite-half, tests/conftest.py): the multi-process tests on this machine, and
# the rest (the kernels', the units', the hosts'). Most of a multi-process test's time is spent waiting for its processes: one
# half after the other leaves a core idle. `make test-serial` runs the suite in one pytest.
SUITE := -m "not fresh_env and not lint and not docs_code and not chaos"
test: test-setup hosts-setup
	$(BIN)/python tools/at_once.py 'processes=$(SUITE) --suite-half processes' \
		'others=$(SUITE) --suite-half others'

test-serial: test-setup hosts-setup
	$(BIN)/python -m pytest $(SUITE)

# The documentation's code blocks, run as written in a real kernel, page by page.
test-docs: test-setup
	$(BIN)/python -m pytest -m docs_code tests/notebook/test_docs_code.py

# The chaos campaign: every style of running ranks with every fault, in a real kernel, the
# invariants checked after each (tests/chaos/), its three shards at once (tools/chaos_shards.py:
# a loaded machine, which finds timing bugs, see benchmarks/README.md); benchmarks/chaos.py
# runs many at random.
test-chaos: test-setup
	$(BIN)/python tools/chaos_shards.py

test-install: test-setup
	$(BIN)/python -m pytest -m fresh_env tests/packaging tests/binder

lint: test-setup
	$(BIN)/python -m pytest -m lint tests/unit/test_lint.py

# JupyterLab on the notebooks, to see the live view and the config form as widgets.
lab: setup
	$(BIN)/python -c "import jupyterlab" 2>/dev/null \
		|| $(BIN)/python -m pip install --quiet jupyterlab $(TORCH_PIN)
	$(BIN)/python -m jupyterlab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

# The documentation site, built offline into site/ in strict mode, then every internal link
# and the API reference's coverage of the public names checked.
$(BIN)/.nb_accel-docs-installed: $(BIN)/.nb_accel-installed pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[docs]" $(TORCH_PIN)
	touch $@

docs: $(BIN)/.nb_accel-docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet
	$(BIN)/python tools/check_site.py site

# The SSH hosts and the SLURM cluster of the tests (network namespaces, root only): Debian's
# OpenSSH server, SLURM and munge, and the folder sshd's privilege separation needs.
HOSTS_PACKAGES := openssh-server slurm-wlm munge
hosts-setup:
	@if [ "$$(id -u)" = 0 ] && { [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/sbin/slurmd ] \
		|| [ ! -x /usr/sbin/munged ]; }; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q $(HOSTS_PACKAGES) >/dev/null 2>&1 \
		|| (apt-get update -q >/dev/null && apt-get install -y -q $(HOSTS_PACKAGES) >/dev/null); \
	fi
	@if [ "$$(id -u)" = 0 ]; then mkdir -p /run/sshd; fi

# Opt-in lane: Accelerate's own tests (its multi-process scripts from the installed package, its
# unit tests from its source distribution), run on Accelerate and, imports swapped, on nb_accel.
test-accelerate: test-setup
	$(BIN)/python -m pip install --quiet $(ACCELERATE_PIN) parameterized $(TORCH_PIN)
	NB_ACCEL_ACCELERATE_SUITE=1 $(BIN)/python -m pytest -v tests/accelerate_suite

# What a lane's tests need besides the package and the extras it tests.
LANE_TEST_DEPS := "pytest>=8" "pytest-timeout>=2.2" "psutil>=5.9"

# The lanes that mirror the notebook services' stacks (../shared/stacks/): each installs the
# project under the service's pip constraints, in an environment tools/lane_env.py keeps between
# runs on this machine (see its docstring).
LANE_ENV := $(PYTHON) tools/lane_env.py
#: Where ipywidgets 7 and 8 differ (Kaggle is Colab's image with ipywidgets 8.1.5 over it).
WIDGET_TESTS := tests/unit/test_progress_widget.py tests/unit/test_config_widget.py \
	tests/unit/test_bar_text.py tests/unit/test_notebook_compat.py \
	tests/notebook/test_config_kernel.py tests/notebook/test_progress_kernel.py \
	tests/notebook/test_knock_on_kernel.py tests/notebook/test_notebooks.py
#: Where Python versions differ: pickling and transfer, fork and spawn, warm workers, pdb and
#: post-mortems, frames and tracebacks.
PY_VERSION_TESTS := tests/multiproc/test_launch.py tests/multiproc/test_failures.py \
	tests/multiproc/test_arguments_and_returns.py tests/multiproc/test_payload_by_reference.py \
	tests/multiproc/test_shared_buffers.py tests/multiproc/test_warm_launch.py \
	tests/multiproc/test_terminal_prompts.py tests/multiproc/test_worker_lifecycle.py

# Colab's GPU runtime as it is: Python 3.13, torch 2.11.0 (a CUDA build, run on the CPU), IPython
# 7.34, ipywidgets 7.7.1: the unit and notebook folders (every notebook among them) and the
# multi-process tests where Python versions differ.
#: Its two halves: the unit folder, and the kernels' (the notebook folder and those multi-process
#: tests); CI runs the first in the background while `make test` runs.
test-colab: test-colab-units test-colab-kernels

test-colab-units:
	venv=$$($(LANE_ENV) colab) && $$venv/bin/python -m pytest -m "not lint and not docs_code and not chaos" tests/unit

test-colab-kernels:
	venv=$$($(LANE_ENV) colab) && $$venv/bin/python -m pytest -m "not lint and not docs_code and not chaos" \
		tests/notebook $(PY_VERSION_TESTS)

# Colab's front end's stack in a browser: the classic Notebook 6.5.7 with ipywidgets 7.7.1 draws
# the live view and the config form (screenshots in build/browser/classic-*.png).
test-classic: chromium
	venv=$$($(LANE_ENV) colab) && NB_ACCEL_BROWSER_TESTS=1 NB_ACCEL_CHROMIUM=$(CHROMIUM) \
		$$venv/bin/python -m pytest -v tests/browser/test_classic_rendering.py

# Kaggle's: the same with ipywidgets 8.1.5.
test-kaggle:
	venv=$$($(LANE_ENV) kaggle) && $$venv/bin/python -m pytest $(WIDGET_TESTS)

# The XLA lane: the XLA path on torch_xla's CPU device, on Colab's TPU runtime (Python 3.13,
# torch 2.9.0, torch_xla 2.9.0), with the package as a user's `pip install nb-accel[xla]` gets it.
test-xla:
	venv=$$($(LANE_ENV) xla) && PJRT_DEVICE=CPU $$venv/bin/python -m pytest tests/xla \
		tests/unit/test_private_apis.py

# The trackers lane: the six hosted trackers (trackio, Aim, Comet, ClearML, DVCLive, SwanLab) on
# their real libraries, each offline, in their own venv; every pip command pins torch so that pip
# never swaps it, and NB_ACCEL_TRACKERS_LANE=1 makes a missing library a failure instead of a skip.
TRACKERS_VENV := .venv-trackers
TRACKERS_EXTRAS := trackio,aim,comet_ml,clearml,dvclive,swanlab
$(TRACKERS_VENV)/.installed: pyproject.toml Makefile
	test -x $(TRACKERS_VENV)/bin/python || $(PYTHON) -m venv $(TRACKERS_VENV)
	$(TRACKERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TRACKERS_VENV)/bin/python -m pip install --quiet $(TORCH_PIN)
	$(TRACKERS_VENV)/bin/python -m pip install --quiet -e ".[$(TRACKERS_EXTRAS)]" \
		$(LANE_TEST_DEPS) $(TORCH_PIN)
	touch $@

trackers-env: $(TRACKERS_VENV)/.installed

test-trackers: trackers-env
	NB_ACCEL_TRACKERS_LANE=1 $(TRACKERS_VENV)/bin/python -m pytest -v -rs \
		tests/multiproc/test_trackers_more.py tests/unit/test_private_apis.py

# The Ray lane: launches on a real Ray cluster (Ray's own `ray start` on two network namespaces,
# the kernel on the head node), the chaos campaign's ray style among them, with the package as
# `pip install nb-accel[ray]` gets it, in its own venv; NB_ACCEL_RAY_LANE=1 makes a missing Ray
# a failure instead of a skip.
RAY_VENV := .venv-ray
$(RAY_VENV)/.installed: pyproject.toml Makefile
	test -x $(RAY_VENV)/bin/python || $(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(RAY_VENV)/bin/python -m pip install --quiet $(TORCH_PIN)
	$(RAY_VENV)/bin/python -m pip install --quiet -e ".[ray,examples]" $(LANE_TEST_DEPS) $(TORCH_PIN)
	touch $@

ray-env: $(RAY_VENV)/.installed

test-ray: ray-env hosts-setup
	NB_ACCEL_RAY_LANE=1 $(RAY_VENV)/bin/python -m pytest -v -rs tests/ray

# Opt-in: the notebooks run in JupyterLab in headless Chromium (Debian's package: Playwright
# downloads no browser here); screenshots go to build/browser/.
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

chromium:
	test -x $(CHROMIUM) || $(SUDO) apt-get install -y chromium \
		|| ($(SUDO) apt-get update && $(SUDO) apt-get install -y chromium)

$(BIN)/.nb_accel-browser-installed: $(BIN)/.nb_accel-test-installed Makefile chromium
	$(BIN)/python -m pip install --quiet jupyterlab playwright $(TORCH_PIN)
	touch $@

test-browser: $(BIN)/.nb_accel-browser-installed
	NB_ACCEL_BROWSER_TESTS=1 NB_ACCEL_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -v tests/browser \
		--ignore=tests/browser/test_classic_rendering.py

# The documentation's screenshots (docs/images/, committed): the browser lane's pictures of the
# widgets, made small with Pillow by tools/docs_images.py.
screenshots: test-browser
	$(BIN)/python -m pip install --quiet pillow $(TORCH_PIN)
	$(BIN)/python tools/docs_images.py

# Accelerate is only a comparison row; the torch pin keeps pip from replacing the CPU build.
bench: test-setup
	$(BIN)/python -m pip install --quiet $(ACCELERATE_PIN) $(TORCH_PIN)
	$(BIN)/python benchmarks/launch.py
	$(BIN)/python benchmarks/data.py
	$(BIN)/python benchmarks/interrupt.py
	$(BIN)/python benchmarks/loader.py
	$(BIN)/python benchmarks/step.py
	$(BIN)/python benchmarks/fsdp.py
	$(BIN)/python benchmarks/progress.py
	$(BIN)/python benchmarks/widget.py
	$(BIN)/python benchmarks/magic.py
	$(BIN)/python benchmarks/output.py
	$(BIN)/python benchmarks/multinode.py
	$(BIN)/python benchmarks/recover.py

clean:
	rm -rf $(VENV) build site *.egg-info
