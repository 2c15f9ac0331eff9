#!/usr/bin/env bash
# Upstream baremetal-operator's CRDs (metal3.io), generated the way upstream generates them
# (controller-gen crd:allowDangerousTypes=true,crdVersions=v1, as its Makefile's
# `manifests` target) from its published Go module github.com/metal3-io/baremetal-operator/apis
# at the version pinned in versions.env, fetched through the Go module proxy. The proxy
# refuses the repository's main module (where the generated YAML lives), so the YAML is
# made here from the same source. Cached outside the repository, keyed by the versions;
# never committed (docs/install.md, "Beside metal3").
#
#   tools/metal3/crds.sh           generate if missing, print the directory of the CRD files
#                                  (make metal3; make test runs it before the tests)
#   tools/metal3/crds.sh --cached  print it only if generated already; else say so, exit 1
#                                  (the tests: they never build, make does)
#   METALMEND_CACHE=DIR      cache root (default: ${XDG_CACHE_HOME:-~/.cache}/metalmend)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${METALMEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metalmend}/metal3"
out="$cache/bmo-apis-$BMO_APIS_VERSION-controller-gen-$CONTROLLER_TOOLS_VERSION"
gen="$cache/controller-gen-$CONTROLLER_TOOLS_VERSION"

fail() { echo "metalmend: cannot make upstream metal3 CRDs: $1" >&2; exit 1; }

if [ -s "$out/metal3.io_baremetalhosts.yaml" ]; then
  echo "$out"
  exit 0
fi
if [ "${1:-}" = --cached ]; then
  echo "metalmend: upstream metal3 CRDs not generated yet ($out): run 'make metal3' (make test does)" >&2
  exit 1
fi
command -v go >/dev/null 2>&1 || fail "'go' is not on PATH (install Go >= 1.26)"
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT

if [ ! -x "$gen" ]; then
  echo "metalmend: building controller-gen $CONTROLLER_TOOLS_VERSION (first use only)" >&2
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 go build -trimpath -ldflags "-s -w" \
     -o "$tmp/controller-gen" sigs.k8s.io/controller-tools/cmd/controller-gen) >"$tmp/log" 2>&1 \
    || { tail -n 20 "$tmp/log" >&2; fail "'go build' of controller-gen failed"; }
  mv "$tmp/controller-gen" "$gen"
fi

module="github.com/metal3-io/baremetal-operator/apis@$BMO_APIS_VERSION"
# Only this module skips the checksum database (it is not listed there): its hash is
# compared with the pinned one below instead.
info="$(cd "$tmp" && GONOSUMDB=github.com/metal3-io/baremetal-operator GOFLAGS=-mod=mod \
  go mod download -json "$module" 2>&1)" || fail "the Go module proxy refused $module: $info"
sum="$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p' <<<"$info")"
dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$info")"
[ "$sum" = "$BMO_APIS_SUM" ] || fail "$module has hash $sum, not the pinned $BMO_APIS_SUM"

# controller-gen loads the packages with their dependencies: a writable copy of the module.
cp -r "$dir" "$tmp/apis" && chmod -R u+w "$tmp/apis"
(cd "$tmp/apis" && GOFLAGS=-mod=mod nice -n 10 "$gen" crd:allowDangerousTypes=true,crdVersions=v1 \
   paths=./metal3.io/... output:crd:dir="$tmp/crds") >"$tmp/log" 2>&1 \
  || { tail -n 20 "$tmp/log" >&2; fail "controller-gen failed on $module"; }
[ -s "$tmp/crds/metal3.io_baremetalhosts.yaml" ] || fail "controller-gen made no BareMetalHost CRD"
mkdir -p "$(dirname "$out")"
rm -rf "$out"
mv "$tmp/crds" "$out"
echo "$out"
