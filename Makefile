# `make demo` and `make test` set everything up themselves on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export LLM_ASSETS_HOME ?= $(CURDIR)/.llm_assets

.PHONY: install bytecode demo test test-quick ui worker lint typecheck clean bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU wheel of torch; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[local,dev,celery]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/llm-assets demo

# The suite starts a few hundred Python processes (commands, Dagster's code servers and run
# workers, Celery workers) that import the package: compiled once here, not in each of them
# where PYTHONDONTWRITEBYTECODE is set.
bytecode: install
	$(PY) -m compileall -q llm_assets tests

# Three workers on two cores: a third of the suite's time is spent waiting (CLI and Dagster
# subprocesses, fake servers, sensor ticks). Whole files to a worker, in the order the
# suite's conftest gives them (the files marked slow first), not xdist's largest-first.
test: install bytecode
	$(PY) -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# The edit-test loop: the lifecycle, ledger, quota learner, spec, custom id, personal-data
# and evaluation tests and every adapter against its fake (the provider contract), less the
# end-to-end ones (marked one_database), on SQLite only (the PostgreSQL halves are
# deselected, not skipped); `make test` runs everything.
QUICK_TESTS = tests/test_automation_units.py tests/test_bad_input.py tests/test_custom_ids.py \
	tests/test_day_state.py tests/test_eval_metrics.py tests/test_eval_prices.py tests/test_eval_recommend.py \
	tests/test_eval_report.py tests/test_eval_spec.py tests/test_ledger.py \
	tests/test_lifecycle.py tests/test_pii_forms.py tests/test_provider_contract.py \
	tests/test_quota_learning.py tests/test_request_lines.py tests/test_secret_urls.py \
	tests/test_snapshot_rows.py tests/test_spec.py tests/test_storage.py
test-quick: install bytecode
	env -u LLM_ASSETS_TEST_DATABASE_URL $(PY) -m pytest -n 2 --dist loadfile \
		-m "not one_database" -k "not postgresql" $(QUICK_TESTS)

# dagster dev with the daemon (sensors on by default) on the local SQLite instance. Its port:
# PORT, else DAGSTER_PORT (from the environment or `make ui PORT=3001`), else 3000.
UI_PORT = $(or $(PORT),$(DAGSTER_PORT),3000)
ui: install
	home="$${DAGSTER_HOME:-$(LLM_ASSETS_HOME)/dagster}"; mkdir -p "$$home"; \
	test -f "$$home/dagster.yaml" || printf 'telemetry:\n  enabled: false\nnux:\n  enabled: false\n' > "$$home/dagster.yaml"; \
	DAGSTER_HOME="$$home" $(VENV)/bin/dagster dev -w workspace.yaml --port $(UI_PORT)

# A Celery worker for LLM_ASSETS_EXECUTOR=celery: it takes the steps of any run on the broker
# (LLM_ASSETS_CELERY_BROKER, LLM_ASSETS_CELERY_BACKEND; celery.yaml). Start one per machine
# with the same LLM_ASSETS_* and DAGSTER_* environment as the code location; WORKER_ARGS goes
# to celery (e.g. `make worker WORKER_ARGS=--concurrency=1`).
worker: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dagster-celery worker start -A dagster_celery.app -y celery.yaml $(if $(WORKER_ARGS),-- $(WORKER_ARGS))

# One day of N items through every step on SQLite and on PostgreSQL (127.0.0.1:5432, database
# llm_assets_bench dropped and created per run); bench/README.md has the results. Each
# configuration is stopped after BENCH_MAX_SECONDS and the table says where.
BENCH_ITEMS ?= 10000 100000 1000000
BENCH_DBS ?= sqlite postgres
BENCH_MAX_SECONDS ?= 1800
bench: install
	$(PY) bench/pipeline_scale.py --items $(BENCH_ITEMS) --db $(BENCH_DBS) --max-seconds $(BENCH_MAX_SECONDS)

# mypy with pydantic's plugin over llm_assets/ (pyproject.toml's [tool.mypy]); about two
# minutes cold, seconds once .mypy_cache holds the last run.
typecheck: install
	$(PY) -m mypy

lint: typecheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf "$(LLM_ASSETS_HOME)"
