#!/usr/bin/env bash
# Builds the helm CLI (for the chart's tests) from its published Go module at the version
# pinned in versions.env and go.mod, once, into a cache outside the repository keyed by
# that version. A second run finds the cache and does nothing.
#
#   tools/helm/build.sh      build helm if missing, print its path
#   METALMEND_CACHE=DIR      cache root (default: ${XDG_CACHE_HOME:-~/.cache}/metalmend)
#   METALMEND_HELM=PATH      use this helm binary instead (nothing is built)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

if [ -n "${METALMEND_HELM:-}" ]; then
  [ -x "$METALMEND_HELM" ] || { echo "metalmend: METALMEND_HELM=$METALMEND_HELM is not an executable" >&2; exit 1; }
  echo "$METALMEND_HELM"
  exit 0
fi

cache="${METALMEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metalmend}/helm"
dir="$cache/helm-$HELM_VERSION"
if [ -x "$dir/helm" ]; then
  echo "$dir/helm"
  exit 0
fi

grep -q "helm.sh/helm/v3 $HELM_VERSION\b" "$here/go.mod" || {
  echo "metalmend: tools/helm/go.mod does not pin helm.sh/helm/v3 $HELM_VERSION (versions.env)" >&2
  exit 1
}
command -v go >/dev/null 2>&1 || {
  echo "metalmend: cannot build helm: 'go' is not on PATH (install Go >= 1.26, or set METALMEND_HELM)" >&2
  exit 1
}

# Into a temporary directory, then renamed into place: an interrupted build never leaves a
# half-written binary that a later run would trust.
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "metalmend: building helm $HELM_VERSION (first use only; takes a few minutes)" >&2
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
if ! (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 go build -trimpath \
      -ldflags "$ldflags" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm) >"$tmp/build.log" 2>&1; then
  tail -n 20 "$tmp/build.log" >&2
  echo "metalmend: 'go build' of helm failed (log above)" >&2
  exit 1
fi
mkdir -p "$dir"
mv "$tmp/helm" "$dir/helm"
echo "$dir/helm"
