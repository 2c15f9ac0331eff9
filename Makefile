# The two commands the README shows, and what they need. Everything installs itself:
# a virtualenv with pinned packages, and the upstream control plane (built once, cached
# outside the repository, keyed by version).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test k8s lint bench venv clean

demo: venv k8s
	$(BIN)/metalmend demo

test: venv k8s lint
	$(BIN)/pytest

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "metalmend needs Python >= 3.11 (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,lab]'
	touch $@

k8s:
	@bash tools/k8s/build.sh >/dev/null

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

bench: venv k8s
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .lab .lab-demo .pytest_cache .mypy_cache .ruff_cache
