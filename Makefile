# Both targets do all their own set-up: a fresh machine needs only python3 (3.11+) and pip.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test bench clean

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# the demo compares against PyTorch, so it installs the test extras too
demo: $(VENV)/.test
	$(PY) -m tapegrad demo

test: $(VENV)/.test
	$(PY) -m pytest -n 2 tests

bench: $(VENV)/.test
	$(PY) -m tapegrad bench

clean:
	rm -rf $(VENV) build src/*.egg-info
