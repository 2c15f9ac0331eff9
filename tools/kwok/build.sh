#!/usr/bin/env bash
# Builds kwok (Kubernetes WithOut Kubelet: keeps fake Nodes Ready, with heartbeats and
# Leases, without a kubelet each) from its published Go module at the version pinned in
# versions.env and go.mod, once, into a cache outside the repository keyed by that version.
# The scale benchmark (benchmarks/scale.py) runs it for thousands of Nodes; the lab's own
# kubelet simulator (lab/kubelet.py) is one Python process per host and does not scale
# that far. kwok does nothing without Stages (what to write to a Node, when): the module's
# own node-initialize and node-heartbeat-with-lease stages are copied from the module
# cache into the same cache directory, next to the binary (stages/*.yaml), not into this
# repository. A second run finds the cache and does nothing.
#
#   tools/kwok/build.sh      build kwok if missing, print its path (stages: DIR/stages/)
#   METALMEND_CACHE=DIR      cache root (default: ${XDG_CACHE_HOME:-~/.cache}/metalmend)
#   METALMEND_KWOK=PATH      use this kwok binary instead (nothing is built)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

if [ -n "${METALMEND_KWOK:-}" ]; then
  [ -x "$METALMEND_KWOK" ] || { echo "metalmend: METALMEND_KWOK=$METALMEND_KWOK is not an executable" >&2; exit 1; }
  echo "$METALMEND_KWOK"
  exit 0
fi

cache="${METALMEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metalmend}/kwok"
dir="$cache/$KWOK_VERSION"
STAGES=(kustomize/stage/node/fast/node-initialize.yaml
        kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml)
complete() {
  [ -x "$dir/kwok" ] || return 1
  local stage
  for stage in "${STAGES[@]}"; do [ -f "$dir/stages/$(basename "$stage")" ] || return 1; done
}
if complete; then
  echo "$dir/kwok"
  exit 0
fi

grep -q "sigs.k8s.io/kwok $KWOK_VERSION\b" "$here/go.mod" || {
  echo "metalmend: tools/kwok/go.mod does not pin sigs.k8s.io/kwok $KWOK_VERSION (versions.env)" >&2
  exit 1
}
command -v go >/dev/null 2>&1 || {
  echo "metalmend: cannot build kwok: 'go' is not on PATH (install Go >= 1.26, or set METALMEND_KWOK)" >&2
  exit 1
}

# Into a temporary directory, then renamed into place: an interrupted build never leaves a
# half-written binary that a later run would trust.
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "metalmend: building kwok $KWOK_VERSION (first use only; takes a few minutes)" >&2
ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
if ! (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 go build -trimpath \
      -ldflags "$ldflags" -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok) >"$tmp/build.log" 2>&1; then
  tail -n 20 "$tmp/build.log" >&2
  echo "metalmend: 'go build' of kwok failed (log above)" >&2
  exit 1
fi
module_dir="$(cd "$here" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
mkdir -p "$tmp/stages"
for stage in "${STAGES[@]}"; do cp "$module_dir/$stage" "$tmp/stages/"; done
mkdir -p "$dir"
rm -rf "$dir/stages"
mv "$tmp/stages" "$dir/stages"
mv "$tmp/kwok" "$dir/kwok"
echo "$dir/kwok"
