#!/usr/bin/env bash
# Builds OpenShift's MachineHealthCheck controller (github.com/openshift/machine-api-operator
# cmd/machine-healthcheck, the controller metal3's reboot-annotation design was written for)
# from its published Go module at the version pinned in versions.env, once, into a cache
# outside the repository keyed by that version. The lab's OpenShift mode
# (`metalmend lab up --machine-api openshift`, tests/e2e/test_openshift_lab.py) runs it.
#
# How, and why not as tools/capi does (a go.mod here requiring the module): the module's
# go.mod replaces k8s.io/apiserver, k8s.io/kubelet and k8s.io/kubernetes with
# github.com/openshift/kubernetes staging copies, which the Go module proxy refuses to
# serve. So the module is downloaded through the proxy (`go mod download`), copied to a
# build directory, those three replace lines (and only those: any other change to them
# fails the build here, rather than building something else) are deleted, and the
# commands are built in the module itself with GOFLAGS=-mod=mod, against upstream
# k8s.io/apiserver v0.34.1 (the version its go.mod requires). The only go.sum lines the
# deletion needs that the module's own go.sum lacks are in go.sum.extra (fetched from the
# proxy once, with GOSUMDB=off, as sum.golang.org is out of reach here): with them, the
# build checks every module against a pinned hash and needs no checksum database.
#
# cmd/nodelink-controller (OpenShift's Machine -> Node linker) is tried the same way; if it
# does not build, that is reported (its log kept beside the binary as
# nodelink-controller.build.log) and not an error: the lab then links Machines to Nodes with
# metalmend's node-link. The machine-api CRDs (install/..._02_machine.Default.crd.yaml,
# ..._03_machineset.Default.crd.yaml, ..._07_machinehealthcheck.crd.yaml) are copied from the
# module beside the binaries (crds/), not into this repository. A second run finds the
# cache and does nothing.
#
#   tools/openshift/build.sh           build if missing, print the machine-healthcheck path
#                                      (CRDs: DIR/crds/; DIR/nodelink-controller if it built)
#   tools/openshift/build.sh --cached  build nothing: print the path if the cache is
#                                      complete, fail (naming `make openshift`) if it is not
#   METALMEND_CACHE=DIR                cache root (default: ${XDG_CACHE_HOME:-~/.cache}/metalmend)
#   METALMEND_OPENSHIFT=PATH           use this machine-healthcheck binary instead (nothing is
#                                      built; CRDs are then looked for in PATH's directory)
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
  *) gotool_fail "tools/openshift/build.sh takes no argument but --cached, not $1" ;;
esac
gotool_override openshift "${METALMEND_OPENSHIFT:-}"

cache="${METALMEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metalmend}/openshift"
dir="$cache/$OPENSHIFT_MAO_VERSION"
crd_files=(
  0000_30_machine-api-operator_02_machine.Default.crd.yaml
  0000_30_machine-api-operator_03_machineset.Default.crd.yaml
  0000_30_machine-api-operator_07_machinehealthcheck.crd.yaml
)
complete() {
  [ -x "$dir/machine-healthcheck" ] || return 1
  local f
  for f in "${crd_files[@]}"; do
    [ -f "$dir/crds/$f" ] || return 1
  done
}
if complete; then
  echo "$dir/machine-healthcheck"
  exit 0
fi
$cached_only && gotool_fail "OpenShift's machine-healthcheck $OPENSHIFT_MAO_VERSION is not built in $dir (run: make openshift)"

command -v go >/dev/null 2>&1 \
  || gotool_fail "cannot build machine-healthcheck: 'go' is not on PATH (install Go >= 1.26, or set METALMEND_OPENSHIFT)"
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.build.XXXXXX")"
# shellcheck disable=SC2064  # the path is fixed now, on purpose
trap "chmod -R u+w '$tmp' 2>/dev/null; rm -rf '$tmp'" EXIT
echo "metalmend: building OpenShift machine-healthcheck $OPENSHIFT_MAO_VERSION (first use only; takes minutes)" >&2

# The module, through the proxy (GOPROXY as the user has it: proxy.golang.org by default).
module_dir="$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$OPENSHIFT_MAO_MODULE@$OPENSHIFT_MAO_VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -n "$module_dir" ] && [ -f "$module_dir/go.mod" ] \
  || gotool_fail "could not download $OPENSHIFT_MAO_MODULE@$OPENSHIFT_MAO_VERSION through the Go module proxy"
src="$tmp/src"
cp -R "$module_dir" "$src"
chmod -R u+w "$src"

# The three replace lines the proxy cannot serve, each exactly once.
for module in k8s.io/apiserver k8s.io/kubelet k8s.io/kubernetes; do
  pattern="^[[:space:]]*${module//./\\.} => github\.com/openshift/kubernetes"
  [ "$(grep -c -E "$pattern" "$src/go.mod")" = 1 ] \
    || gotool_fail "$OPENSHIFT_MAO_MODULE $OPENSHIFT_MAO_VERSION: go.mod does not replace $module with openshift/kubernetes exactly once (versions.env changed? check tools/openshift/build.sh)"
  sed -i -E "\|$pattern|d" "$src/go.mod"  # "|": the pattern has "/"
done
cat "$here/go.sum.extra" >>"$src/go.sum"

build() {  # build NAME: ./cmd/NAME into $tmp/NAME, its log in $tmp/NAME.build.log
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 go build -trimpath -ldflags "-s -w" \
    -o "$tmp/$1" "./cmd/$1") >"$tmp/$1.build.log" 2>&1
}
if ! build machine-healthcheck; then
  tail -n 20 "$tmp/machine-healthcheck.build.log" >&2
  gotool_fail "'go build' of OpenShift's machine-healthcheck failed (log above)"
fi
nodelink=true
if ! build nodelink-controller; then
  nodelink=false
  echo "metalmend: OpenShift's nodelink-controller does not build here (log: $dir/nodelink-controller.build.log);" \
       "the lab links Machines to Nodes with metalmend's node-link" >&2
fi

mkdir -p "$tmp/crds"
for f in "${crd_files[@]}"; do
  [ -f "$src/install/$f" ] || gotool_fail "the module has no install/$f"
  cp "$src/install/$f" "$tmp/crds/"
done
mkdir -p "$dir"
rm -rf "$dir/crds" "$dir/nodelink-controller" "$dir/nodelink-controller.build.log"
mv "$tmp/crds" "$dir/crds"
if $nodelink; then
  mv "$tmp/nodelink-controller" "$dir/nodelink-controller"
else
  mv "$tmp/nodelink-controller.build.log" "$dir/nodelink-controller.build.log"
fi
mv "$tmp/machine-healthcheck" "$dir/machine-healthcheck"
echo "$dir/machine-healthcheck"
