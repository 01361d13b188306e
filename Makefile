# Two entry points for a fresh machine: `make demo` and `make test`.
# Virtual environments and downloads live outside the clone, in the cache directory.

CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/vllm-metax-mcp-tests
VENV ?= $(CACHE)/venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: venv demo test test-fast

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

test: venv
	$(PY) -m pytest -p no:cacheprovider tests

test-fast: venv
	$(PY) -m pytest -p no:cacheprovider -m "not slow" tests
