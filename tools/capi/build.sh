#!/usr/bin/env bash
# Builds the Cluster API core manager (sigs.k8s.io/cluster-api/core: the Cluster, Machine
# and MachineHealthCheck controllers, among others) from its published Go module at the
# version pinned in versions.env and go.mod, once, into a cache outside the repository
# keyed by that version. The lab test where Cluster API's own MachineHealthCheck remediates
# through metalmend's FenceRemediationTemplate (tests/e2e/test_capi_lab.py) runs it. The
# manager does nothing without its CRDs: the module's generated ones
# (core/config/crd/bases/*.yaml) are copied from the module cache into the same cache
# directory, next to the binary (crds/*.yaml), not into this repository. A second run
# finds the cache and does nothing.
#
#   tools/capi/build.sh           build the manager if missing, print its path
#                                 (CRDs: DIR/crds/)
#   tools/capi/build.sh --cached  build nothing: print the path if the cache is complete,
#                                 fail (naming `make capi`) if it is not
#   METALMEND_CACHE=DIR           cache root (default: ${XDG_CACHE_HOME:-~/.cache}/metalmend)
#   METALMEND_CAPI=PATH           use this manager binary instead (nothing is built; its
#                                 CRDs are then looked for in PATH's directory, crds/)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

# shellcheck source=../lib/gotool.sh
source "$here/../lib/gotool.sh"
cached_only=false
case "${1:-}" in
  "") ;;
  --cached) cached_only=true ;;
  *) gotool_fail "tools/capi/build.sh takes no argument but --cached, not $1" ;;
esac
gotool_override capi "${METALMEND_CAPI:-}"

cache="${METALMEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metalmend}/capi"
dir="$cache/$CAPI_VERSION"
complete() {
  [ -x "$dir/manager" ] || return 1
  [ -f "$dir/crds/cluster.x-k8s.io_machinehealthchecks.yaml" ] || return 1
  [ -f "$dir/crds/cluster.x-k8s.io_machines.yaml" ] || return 1
  [ -f "$dir/crds/cluster.x-k8s.io_clusters.yaml" ] || return 1
}
if complete; then
  echo "$dir/manager"
  exit 0
fi
$cached_only && gotool_fail "the Cluster API manager $CAPI_VERSION is not built in $dir (run: make capi)"

version="${CAPI_VERSION#v}"
major="${version%%.*}"
minor="${version#*.}"
minor="${minor%%.*}"
gotool_build manager "$here" sigs.k8s.io/cluster-api "$CAPI_VERSION" sigs.k8s.io/cluster-api/core \
  "-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$CAPI_VERSION -X sigs.k8s.io/cluster-api/version.gitMajor=$major -X sigs.k8s.io/cluster-api/version.gitMinor=$minor"
tmp="$gotool_tmp"
module_dir="$(cd "$here" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)"
[ -d "$module_dir/core/config/crd/bases" ] \
  || gotool_fail "the module sigs.k8s.io/cluster-api $CAPI_VERSION has no core/config/crd/bases in $module_dir"
mkdir -p "$tmp/crds"
cp "$module_dir"/core/config/crd/bases/*.yaml "$tmp/crds/"
chmod u+w "$tmp"/crds/*.yaml
mkdir -p "$dir"
rm -rf "$dir/crds"
mv "$tmp/crds" "$dir/crds"
mv "$tmp/manager" "$dir/manager"
echo "$dir/manager"
