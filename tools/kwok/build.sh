#!/usr/bin/env bash
# Builds kwok (Kubernetes WithOut Kubelet: keeps fake Nodes Ready, with heartbeats and
# Leases, without a kubelet each) from its published Go module at the version pinned in
# versions.env and go.mod, once, into a cache outside the repository keyed by that version.
# The scale benchmark (benchmarks/scale.py) runs it for thousands of Nodes; the lab's own
# kubelet simulator (src/metalmend_lab/kubeletsim.py) is one Python process per host and does not scale
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

# shellcheck source=../lib/gotool.sh
source "$here/../lib/gotool.sh"
gotool_override kwok "${METALMEND_KWOK:-}"

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

gotool_build kwok "$here" sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok \
  "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
tmp="$gotool_tmp"
module_dir="$(cd "$here" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
mkdir -p "$tmp/stages"
for stage in "${STAGES[@]}"; do cp "$module_dir/$stage" "$tmp/stages/"; done
mkdir -p "$dir"
rm -rf "$dir/stages"
mv "$tmp/stages" "$dir/stages"
mv "$tmp/kwok" "$dir/kwok"
echo "$dir/kwok"
