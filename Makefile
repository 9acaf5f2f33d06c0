VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: install test test-fast bench bench-smoke fidelity lint

install:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev,torch]'

test:
	$(PY) -m pytest -q

test-fast:
	$(PY) -m pytest -q -m "not slow"

bench:
	$(PY) -m planner.bench
	$(PY) -m planner.bench --schedules

bench-smoke:
	$(PY) -m planner.bench --smoke

fidelity:
	$(PY) -m planner.cost.fidelity
	$(PY) -m planner.cost.fidelity_moe
	$(PY) -m planner.cost.layer_check
	$(PY) -m planner.cost.device_report

lint:
	$(VENV)/bin/ruff check planner tests
