# `make demo` and `make test` set everything up themselves on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export LLM_ASSETS_HOME ?= $(CURDIR)/.llm_assets

.PHONY: install demo test ui lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU wheel of torch; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[local,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/llm-assets demo

test: install
	$(PY) -m pytest

ui: install
	mkdir -p "$(LLM_ASSETS_HOME)/dagster"
	DAGSTER_HOME="$${DAGSTER_HOME:-$(LLM_ASSETS_HOME)/dagster}" $(VENV)/bin/dagster dev -w workspace.yaml

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf "$(LLM_ASSETS_HOME)"
