#!/usr/bin/env bash
# Builds the lab's upstream control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) from their published Go modules, once, into a cache outside the repository that
# is keyed by version. A second run finds the cache and does nothing.
#
#   tools/k8s/build.sh            build what is missing, print the bin directories
#   METALMEND_CACHE=DIR           cache root (default: ${XDG_CACHE_HOME:-~/.cache}/metalmend)
#
# Binaries named by TEST_ASSET_KUBE_APISERVER / TEST_ASSET_ETCD /
# TEST_ASSET_KUBE_CONTROLLER_MANAGER or found in KUBEBUILDER_ASSETS are used instead of these
# (see metalmend_lab.assets); this script is only needed when they are not set.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${METALMEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metalmend}/k8s"
kube_dir="$cache/kube-$KUBE_VERSION"
etcd_dir="$cache/etcd-$ETCD_VERSION"

fail() {
  echo "metalmend: cannot build the lab control plane: $1" >&2
  echo "metalmend: install Go >= 1.26 (https://go.dev/dl/), or point KUBEBUILDER_ASSETS at a" >&2
  echo "metalmend: directory holding etcd, kube-apiserver and kube-controller-manager, or set" >&2
  echo "metalmend: TEST_ASSET_ETCD, TEST_ASSET_KUBE_APISERVER, TEST_ASSET_KUBE_CONTROLLER_MANAGER." >&2
  exit 1
}

command -v go >/dev/null 2>&1 || fail "'go' is not on PATH"

# Build what is missing into a temporary directory and rename each binary into place, so
# that an interrupted build never leaves a half-written binary that a later run would trust.
# (A cache filled by an older build.sh gains only the binaries added since.)
build_into() { # dir module-dir ldflags packages...
  local dir="$1" mod="$2" ldflags="$3"; shift 3
  local pkg missing=()
  for pkg in "$@"; do
    local bin; bin="$(basename "$pkg")"; [ "$bin" = . ] && bin=etcd
    [ -x "$dir/$bin" ] || missing+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  mkdir -p "$cache"
  local tmp; tmp="$(mktemp -d "$cache/.build.XXXXXX")"
  echo "metalmend: building $(basename "$dir"): ${missing[*]##*/} (first use only; takes minutes)" >&2
  if ! (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$tmp/" -ldflags "$ldflags" "${missing[@]}") >"$tmp/build.log" 2>&1; then
    tail -n 20 "$tmp/build.log" >&2
    rm -rf "$tmp"
    fail "'go build' failed for $(basename "$dir") (log above)"
  fi
  rm -f "$tmp/build.log"
  mkdir -p "$dir"
  for bin in "$tmp"/*; do mv "$bin" "$dir/"; done
  rmdir "$tmp"
}

minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build_into "$etcd_dir" "$here/etcd" "-s -w" .
build_into "$kube_dir" "$here" "$kube_ldflags" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl

echo "$etcd_dir"
echo "$kube_dir"
