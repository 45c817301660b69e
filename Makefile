# Everything a new user needs: `make demo` runs the main job, `make test` the tests.
# Both create the virtual environment (.venv) and install CmdStan on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed
	$(PY) -m ahmc_stan.cmdstan_setup

test: setup
	$(PY) -m pytest -q

demo: setup
	$(PY) -m ahmc_stan.demo

bench: setup
	$(PY) benchmarks/bench_foundation.py

clean:
	rm -rf $(VENV)
