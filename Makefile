# The two commands the README shows, and what they need. Everything installs itself:
# a virtualenv with pinned packages, and the upstream control plane (built once, cached
# outside the repository, keyed by version).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test k8s tools lint bench venv clean

demo: venv k8s
	$(BIN)/metalmend demo

test: venv k8s tools lint
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

# Debian's ipmitool: an independent IPMI client that proves the lab BMCs speak real IPMI;
# iproute2's ss: shows which addresses our IPMI sockets listen on.
tools:
	@{ command -v ipmitool && command -v ss; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ipmitool iproute2) >/dev/null \
	      || echo "metalmend: could not install ipmitool/iproute2; their tests will be skipped"; \
	  else \
	    echo "metalmend: ipmitool or ss missing (apt-get install ipmitool iproute2); their tests will be skipped"; \
	  fi; }

# The import contract (policy without I/O, the lab kept out of the controller) is a test.
lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_import_contract.py

bench: venv k8s
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .lab .lab-demo .pytest_cache .mypy_cache .ruff_cache
