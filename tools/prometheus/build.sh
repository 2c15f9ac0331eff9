#!/usr/bin/env bash
# Builds promtool (Prometheus's `check rules` and `test rules`, for the chart's alert rules:
# tests/test_chart_alerts.py) from the published Go module github.com/prometheus/prometheus
# at the version pinned in versions.env and go.mod, once, into a cache outside the
# repository keyed by that version. A second run finds the cache and does nothing.
#
#   tools/prometheus/build.sh             build promtool if missing, print its path
#   tools/prometheus/build.sh prometheus  the same for the Prometheus server (the lab's
#                                         scrape test, tests/e2e/test_alerts_lab.py)
#   METALMEND_CACHE=DIR          cache root (default: ${XDG_CACHE_HOME:-~/.cache}/metalmend)
#   METALMEND_PROMTOOL=PATH      use this promtool binary instead (nothing is built)
#   METALMEND_PROMETHEUS=PATH    ... and this Prometheus server
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

# shellcheck source=../lib/gotool.sh
source "$here/../lib/gotool.sh"
# Without the cloud service discoveries (AWS, Azure, GCE, Kubernetes, ...: Prometheus's own
# build tags, plugins/plugin_*.go): the lab scrapes static targets and promtool checks rules,
# and their SDKs were most of a cold build's time. Static and file discovery stay.
# shellcheck disable=SC2034  # read by gotool_build
gotool_tags=remove_all_sd
command="${1:-promtool}"
case "$command" in
  promtool) gotool_override promtool "${METALMEND_PROMTOOL:-}" ;;
  prometheus) gotool_override prometheus "${METALMEND_PROMETHEUS:-}" ;;
  *) gotool_fail "tools/prometheus/build.sh builds promtool or prometheus, not $command" ;;
esac

cache="${METALMEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metalmend}/prometheus"
dir="$cache/$PROMETHEUS_VERSION"
if [ -x "$dir/$command" ]; then
  echo "$dir/$command"
  exit 0
fi

# Module v0.MAJOR MINOR.PATCH is the release MAJOR.MINOR.PATCH (v0.316.0 is 3.16.0).
release="${PROMETHEUS_VERSION#v0.}"
release="${release:0:1}.${release:1}"
gotool_build "$command" "$here" github.com/prometheus/prometheus "$PROMETHEUS_VERSION" \
  "github.com/prometheus/prometheus/cmd/$command" \
  "-s -w -X github.com/prometheus/common/version.Version=$release"
mkdir -p "$dir"
mv "$gotool_tmp/$command" "$dir/$command"
echo "$dir/$command"
