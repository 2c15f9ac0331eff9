#!/usr/bin/env bash
# Regenerates tools/k8s/go.mod for the KUBE_VERSION in versions.env: requires
# k8s.io/kubernetes at that version and replaces every staging module it declares
# (k8s.io/api, k8s.io/client-go, ...) by its published v0.<minor>.<patch> release.
# Run after changing KUBE_VERSION, then `go mod tidy` in tools/k8s.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
staging="v0.${KUBE_VERSION#v1.}"
upstream_mod="$(cd "$here" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
  | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
{
  echo "// Builds kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from"
  echo "// k8s.io/kubernetes module. Every staging repository is replaced by its published"
  echo "// v0.x release, because the ./staging paths in k8s.io/kubernetes's own go.mod only"
  echo "// resolve inside the kubernetes repository. Regenerate with tools/k8s/gen-gomod.sh."
  echo "module metalmend.dev/tools/k8s"
  echo
  echo "go 1.26.0"
  echo
  echo "tool ("
  echo "	k8s.io/kubernetes/cmd/kube-apiserver"
  echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
  echo "	k8s.io/kubernetes/cmd/kube-scheduler"
  echo "	k8s.io/kubernetes/cmd/kubectl"
  echo ")"
  echo
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  echo
  echo "replace ("
  grep -E '^\s+k8s\.io/[a-z0-9-]+ => \./staging' "$upstream_mod" \
    | awk -v v="$staging" '{print "\t"$1" => "$1" "v}'
  echo ")"
} > "$here/go.mod.new"
mv "$here/go.mod.new" "$here/go.mod"
echo "wrote $here/go.mod for $KUBE_VERSION (staging $staging); now run: (cd $here && go mod tidy)"
