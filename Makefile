# The two commands the README shows, and what they need. Everything installs itself:
# a virtualenv with pinned packages, and the upstream control plane (built once, cached
# outside the repository, keyed by version).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-site test test-thorough k8s helm metal3 promtool prometheus kwok capi openshift image test-image tools lint bench venv clean

demo: venv k8s
	$(BIN)/metalmend demo

# Site actions (docs/site-actions.md): the design deployed, a server redeployed live.
demo-site: venv k8s
	$(BIN)/metalmend demo-site

# Three workers on two cores, one test file each at a time (module fixtures stay in one
# process); each worker starts its own control plane. Most of a lab test's time is waiting
# on the lab (Leases to expire, grace periods, kills and restarts), so a third worker uses
# the CPU two leave idle; every wait stretches with the load (tests/support.py).
TEST_WORKERS ?= 3

# Every tool a test needs is built here, before pytest starts (cold Go builds take minutes
# on a busy machine: never inside a test, under its timeout); the tests only use the
# cached results and name the make target when one is missing.
test: venv k8s helm metal3 promtool prometheus capi openshift tools test-image lint
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not long"

# Every test, the long ones too (pytest's `long` mark: kills at every step of a flow, the
# chaos run, a second upstream checker's lab), and the long form of the randomised tests
# (tests/support.py, THOROUGH): more kills in the chaos tests, more and fresh property
# cases. Before a release, after a change to a state machine or a controller's steps.
test-thorough: venv k8s helm metal3 promtool prometheus capi openshift tools test-image lint
	METALMEND_TESTS=thorough $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

venv: $(STAMP)

# metalmend itself, and the lab and demos (metalmend-lab, lab/pyproject.toml: the `lab`,
# `demo` and `demo-site` verbs), both editable from this checkout.
$(STAMP): pyproject.toml lab/pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "metalmend needs Python >= 3.11 (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]' -e ./lab
	touch $@

k8s:
	@bash tools/k8s/build.sh >/dev/null

# helm, for the chart's tests (deploy/chart): built once from its Go module, cached by version.
helm:
	@bash tools/helm/build.sh >/dev/null

# Upstream baremetal-operator's CRDs (tests/integration/test_metal3.py): generated once by
# controller-gen from their published Go modules, cached by version.
metal3:
	@bash tools/metal3/crds.sh >/dev/null

# promtool, for the chart's alert rules (check rules, test rules): built once from
# Prometheus's Go module, cached by version.
promtool:
	@bash tools/prometheus/build.sh >/dev/null

# The Prometheus server of the same module and version, for the lab test where it scrapes
# both processes (tests/e2e/test_alerts_lab.py).
prometheus:
	@bash tools/prometheus/build.sh prometheus >/dev/null

# kwok, for the scale benchmark's thousands of Nodes (benchmarks/scale.py): built once from
# its Go module, cached by version. Not needed by the tests.
kwok:
	@bash tools/kwok/build.sh >/dev/null

# The Cluster API core manager and its CRDs, for the lab test where Cluster API's own
# MachineHealthCheck remediates through metalmend's template (tests/e2e/test_capi_lab.py):
# built once from its Go module, cached by version.
capi:
	@bash tools/capi/build.sh >/dev/null

# OpenShift's MachineHealthCheck controller (machine-api-operator's cmd/machine-healthcheck)
# (and its nodelink-controller) and machine-api CRDs, for the tests where OpenShift's own
# check drives metalmend (tests/integration/test_openshift_*.py): built once from its Go
# module with three replace lines deleted (tools/openshift/build.sh says which and why),
# cached by version.
openshift:
	@bash tools/openshift/build.sh >/dev/null

# The container image (docs/install.md): Debian base by mmdebstrap, the wheel by pip;
# cached by content. Needs root (podman); tools/image/build.sh installs what it lacks.
image:
	@nice -n 10 bash tools/image/build.sh

# The image for its tests (tests/e2e/test_image.py), where they can run it: as root, with
# runc or apt-get to install it (the tests skip otherwise, saying why).
test-image:
	@if [ "$$(id -u)" = 0 ] && { [ -x /usr/sbin/runc ] || command -v apt-get >/dev/null 2>&1; }; then \
	  nice -n 10 bash tools/image/build.sh >/dev/null; \
	else \
	  echo "metalmend: not root, or no runc: the image is not built and its tests will be skipped"; \
	fi

# Debian's ipmitool: an independent IPMI client that proves the lab BMCs speak real IPMI;
# iproute2's ss: shows which addresses our IPMI sockets listen on; librsvg2-bin's
# rsvg-convert: renders the demo's pictures in their tests.
tools:
	@{ command -v ipmitool && command -v ss && command -v rsvg-convert; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ipmitool iproute2 librsvg2-bin) >/dev/null \
	      || echo "metalmend: could not install ipmitool/iproute2/librsvg2-bin; their tests will be skipped"; \
	  else \
	    echo "metalmend: ipmitool, ss or rsvg-convert missing (apt-get install ipmitool iproute2 librsvg2-bin); their tests will be skipped"; \
	  fi; }
	@bash tools/postgres/install.sh  # PostgreSQL for the design store's tests (tests/postgres.py)

# The import contract is a test (docs/architecture.md): the layers, the components meeting
# through named interfaces, policy without I/O, the lab kept out, no cycle; and every
# module or setting the prose names exists (tests/unit/test_doc_references.py). Last, the
# duplicate report (pylint's symilar, pinned): where code repeats, printed with its count,
# never a failure.
lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_import_contract.py tests/unit/test_doc_references.py
	@$(BIN)/python tools/lint/duplicates.py || true

bench: venv k8s kwok
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .lab .lab-demo .pytest_cache .mypy_cache .ruff_cache
