# Two entry points for a fresh machine: `make demo` and `make test`.
# Virtual environments and downloads live outside the clone, in the cache directory.

CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/vllm-metax-mcp-tests
VENV ?= $(CACHE)/venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: venv demo lint test test-fast bench

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	touch $@

# Non-editable install: tests drive the installed console script, as a user would.
venv: $(VENV)/.created
	$(PY) -m pip install --quiet --force-reinstall --no-deps .
	$(PY) -m pip install --quiet ".[test,lint]"

demo: venv
	$(PY) -m demo

# Lint, format and types first (config in pyproject.toml): CI enforces them with the tests.
LINTED := vllm_metax_mcp tests bench demo
lint: venv
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy

# The slowest tests are printed at the end so growth is visible.
test: lint
	$(PY) -m pytest -p no:cacheprovider --durations=15 tests

test-fast: lint
	$(PY) -m pytest -p no:cacheprovider --durations=15 -m "not slow" tests

# Every benchmark, each a ratio to a reference measured in the same run (needs the `bench` extra), each in its
# own process; then one table of all of them (what | now | reference | ratio | goal | met?).
BENCHES := bench_pyindex bench_diff_model bench_trace bench_audit_commits bench_plan_trim bench_trim_real bench_port_model
bench: venv
	$(PY) -m pip install --quiet ".[bench]"
	$(PY) -m bench $(BENCHES)
