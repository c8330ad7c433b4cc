# Two commands: `make lab` opens the course, `make test` runs every test (`make check`: the fast part).
# Both create .venv on first use. Override TORCH to pick another build, e.g. `make lab TORCH=torch`;
# TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU-only build (falls back to PyPI).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
STAMP  := $(VENV)/.distlab-installed
LAB_PORT  ?= 8888
LAB_FLAGS ?=
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
# The course's language: `make lab LANG=zh` (or EDITION=zh) opens the Chinese edition, notebooks/zh/,
# and the kit's messages are in Chinese. LANG given on the command line names the edition; the
# programs started here then get the neutral C.UTF-8 locale instead of an invalid "zh".
ifeq ($(origin LANG),command line)
ifeq ($(origin EDITION),undefined)
EDITION := $(if $(filter zh%,$(LANG)),zh,en)
endif
override LANG := C.UTF-8
endif
EDITION ?= en
# Parallel test workers (pytest-xdist): part of the suite waits on kernels, ranks, nbgrader and a
# browser, so one worker more than the 2 cores fills those waits (7:08 against 7:37 with two, in
# docs/measurements.md). TEST_JOBS=0 runs in one process.
TEST_JOBS ?= 3
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -rs $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadgroup)
EDITION_DIR := notebooks$(if $(filter zh,$(EDITION)),/zh)

.PHONY: lab test test-gpu test-cluster check figures lint setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || { \
	  if [ -n "$(TORCH_INDEX)" ]; then \
	    $(PY) -m pip install -q --index-url "$(TORCH_INDEX)" "$(TORCH)" \
	      || { echo "$(TORCH_INDEX) could not be reached: installing $(TORCH) from the default index"; \
	           $(PY) -m pip install -q "$(TORCH)"; }; \
	  else $(PY) -m pip install -q "$(TORCH)"; fi; }
	$(PY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

lab: $(STAMP)
	JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter_config$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	$(if $(filter zh,$(EDITION)),DISTLAB_LANG=zh )PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m jupyterlab \
	  --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
	  --ServerApp.root_dir="$(CURDIR)" \
	  --LabApp.default_url=/lab/tree/$(EDITION_DIR)/00_welcome.ipynb \
	  --LabApp.news_url=None $(ROOT_FLAG) $(LAB_FLAGS)

lint: $(STAMP)
	$(PY) -m ruff check src tests bench grader notebooks/_build
	$(PY) -m mypy src/distlab grader

test: $(STAMP) lint
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PYTEST) -m "not cluster"

# On a machine with NVIDIA GPUs: the GPU tests, then every notebook headless, which picks NCCL
# by itself where every rank gets a GPU (4 by default). Skipped, saying so, without a GPU.
test-gpu: $(STAMP)
	@if ! nvidia-smi -L >/dev/null 2>&1; then echo "make test-gpu: skipped, no NVIDIA GPU here"; exit 0; fi; \
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py \
	  "tests/test_notebooks.py::test_notebook_runs_clean"

# The same cells on a real two-node SLURM cluster that tests/slurm_cluster.py brings up in network
# namespaces on this machine. Needs root; installs Debian's slurm-wlm and munge when missing.
test-cluster: $(STAMP)
	@if [ "$$(id -u)" != 0 ]; then echo "make test-cluster: skipped, it needs root (network namespaces, SLURM daemons)"; exit 0; fi; \
	if ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then \
	  if ! command -v apt-get >/dev/null; then echo "make test-cluster: skipped, no apt-get to install slurm-wlm and munge"; exit 0; fi; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null) \
	    || { echo "make test-cluster: skipped, apt-get could not install slurm-wlm and munge"; exit 0; }; \
	fi; \
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest -q -p no:cacheprovider -m cluster tests/test_cluster_slurm.py

# While you work: lint, types and the fast tests (no browser, no notebook or nbgrader runs end to end).
check: $(STAMP) lint
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PYTEST) -m "not slow and not browser and not gpu and not cluster" \
	  --ignore=tests/browser

# The pictures the notebooks show before any cell runs (notebooks/figures/*.svg, notebooks/zh/figures/*.svg), drawn from the
# recorded runs in notebooks/figures/recorded.json; `make figures RECORD=1` runs the ranks again first.
figures: $(STAMP)
	$(PY) notebooks/_build/figures.py $(if $(RECORD),--record)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
