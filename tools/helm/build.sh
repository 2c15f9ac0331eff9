#!/usr/bin/env bash
# Builds the helm CLI (for the chart's tests) from its published Go module at the version
# pinned in versions.env and go.mod, once, into a cache outside the repository keyed by
# that version. A second run finds the cache and does nothing.
#
#   tools/helm/build.sh      build helm if missing, print its path (make helm)
#   tools/helm/build.sh --cached   print it only if built already; else say so, exit 1
#                                  (the tests: they never build, make does)
#   METALMEND_CACHE=DIR      cache root (default: ${XDG_CACHE_HOME:-~/.cache}/metalmend)
#   METALMEND_HELM=PATH      use this helm binary instead (nothing is built)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

# shellcheck source=../lib/gotool.sh
source "$here/../lib/gotool.sh"
gotool_override helm "${METALMEND_HELM:-}"

cache="${METALMEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metalmend}/helm"
dir="$cache/helm-$HELM_VERSION"
if [ -x "$dir/helm" ]; then
  echo "$dir/helm"
  exit 0
fi
[ "${1:-}" != --cached ] || gotool_fail "helm $HELM_VERSION is not built yet: run 'make helm' (make test does)"

gotool_build helm "$here" helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
  "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
mkdir -p "$dir"
mv "$gotool_tmp/helm" "$dir/helm"
echo "$dir/helm"
