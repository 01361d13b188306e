# Two entry points for a fresh machine: `make demo` and `make test`.
# Virtual environments and downloads live outside the clone, in the cache directory.

CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/vllm-metax-mcp-tests
VENV ?= $(CACHE)/venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: venv demo test test-fast bench

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	touch $@

# Non-editable install: tests drive the installed console script, as a user would.
venv: $(VENV)/.created
	$(PY) -m pip install --quiet --force-reinstall --no-deps .
	$(PY) -m pip install --quiet ".[test]"

demo: venv
	$(PY) -m demo

# The slowest tests are printed at the end so growth is visible.
test: venv
	$(PY) -m pytest -p no:cacheprovider --durations=15 tests

test-fast: venv
	$(PY) -m pytest -p no:cacheprovider --durations=15 -m "not slow" tests

# Every benchmark, each a ratio to a reference measured in the same run (needs the `bench` extra).
BENCHES := bench_pyindex bench_diff_model bench_audit_commits bench_trim_real
bench: venv
	$(PY) -m pip install --quiet ".[bench]"
	set -e; for b in $(BENCHES); do echo "== $$b"; $(PY) -m bench.$$b; done
