#!/usr/bin/env bash
# Builds metalmend's container image with podman (docs/install.md, "Container image"):
#
# 1. a Debian base (python3, ca-certificates; no compiler, no pip) made by mmdebstrap into
#    a tarball and imported (public container registries are not used);
# 2. the wheel of this checkout and its pinned dependencies (constraints.txt) as a
#    wheelhouse, installed into /opt/metalmend with pip run from its own wheel, network off;
# 3. a non-root user (10001); the root filesystem may be mounted read-only.
#
# Cached by content: the image is tagged localhost/metalmend:<hash of the sources, the
# constraints and this directory>; an existing tag is reused at once. The base tarball is
# cached under ~/.cache/metalmend/image, keyed by the suite and mmdebstrap's options.
#
#   tools/image/build.sh       build (or find) the image; print its tag (make image; make
#                              test runs it first, as root, when podman can run)
#   tools/image/build.sh --cached   print the tag only if that image exists; else say so,
#                              exit 1 (the tests: they never build, make does)
#   METALMEND_IMAGE_REBUILD=1  rebuild even when cached (a base with newer Debian packages)
#
# Needs root (podman's storage and runc); installs mmdebstrap, podman and runc from Debian
# when missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
SUITE=bookworm  # Python 3.11, as the project requires
BASE_PACKAGES=python3,ca-certificates
cache="${METALMEND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metalmend}/image"
PYTHON="${PYTHON:-python3}"

fail() { echo "metalmend: cannot build the image: $1" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "podman here runs as root (run 'sudo make image')"

cached_only=""
[ "${1:-}" != --cached ] || cached_only=1
if [ -z "$cached_only" ] && { ! command -v mmdebstrap >/dev/null || ! command -v podman >/dev/null \
     || [ ! -x /usr/sbin/runc ]; }; then
  command -v apt-get >/dev/null || fail "mmdebstrap, podman and runc are missing and there is no apt-get"
  echo "metalmend: installing mmdebstrap, podman and runc from Debian" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
     --no-install-recommends mmdebstrap podman runc uidmap) >/dev/null \
    || fail "apt-get install mmdebstrap podman runc failed"
fi
# Debian's podman with Debian's runc, as root, without systemd: these flags everywhere.
podman() { command podman --runtime /usr/sbin/runc --cgroup-manager cgroupfs "$@"; }

# src/metalmend only: the lab (src/metalmend_lab, its own distribution) is not in the image.
key="$(cd "$repo" && { find src/metalmend -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
        | sort -z | xargs -0 sha256sum; sha256sum pyproject.toml constraints.txt \
        tools/image/build.sh tools/image/Containerfile; } | sha256sum | cut -c1-16)"
tag="localhost/metalmend:$key"
if [ -z "${METALMEND_IMAGE_REBUILD:-}" ] && podman image exists "$tag" 2>/dev/null; then
  echo "$tag"
  exit 0
fi
if [ -n "$cached_only" ]; then
  echo "metalmend: the image $tag is not built yet: run 'sudo make image' (make test does, as root)" >&2
  exit 1
fi

mkdir -p "$cache"
work="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# minbase, without documentation, man pages and translations; apt's lists dropped.
base_options=(--quiet --variant=minbase --include="$BASE_PACKAGES"
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*')
base_key="$(printf '%s\n' "$SUITE" "${base_options[@]}" | sha256sum | cut -c1-16)"
base_tar="$cache/base-$SUITE-$base_key.tar"
if [ -n "${METALMEND_IMAGE_REBUILD:-}" ] || [ ! -s "$base_tar" ]; then
  echo "metalmend: making the Debian $SUITE base with mmdebstrap (first use only)" >&2
  nice -n 10 mmdebstrap "${base_options[@]}" "$SUITE" "$work/base.tar" >&2 \
    || fail "mmdebstrap failed"
  mv "$work/base.tar" "$base_tar"
  find "$cache" -maxdepth 1 -name 'base-*.tar' ! -name "$(basename "$base_tar")" -delete
fi
base="localhost/metalmend-base:$base_key"
podman image exists "$base" || podman import --quiet "$base_tar" "$base" >/dev/null \
  || fail "podman import of $base_tar failed"

# The wheelhouse: this checkout's wheel (metalmend alone: the lab and the demos are the
# separate metalmend-lab, lab/pyproject.toml), its dependencies as pinned, and pip (run
# from its wheel inside the build, never installed into the image).
mkdir -p "$work/context/wheels"
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check -c "$repo/constraints.txt" \
  -w "$work/context/wheels" "$repo" pip >&2 || fail "pip wheel failed"
mv "$work/context/wheels"/pip-*.whl "$work/context/wheels/pip.whl"
cp "$here/Containerfile" "$work/context/"
podman build --quiet --network none --ulimit nofile=20000:20000 --ulimit nproc=1000:1000 \
  --build-arg BASE="$base" --tag "$tag" --tag localhost/metalmend:latest \
  --file "$work/context/Containerfile" "$work/context" >/dev/null || fail "podman build failed"
# Earlier builds of other sources are not kept (each is ~120 MB above the shared base).
podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/metalmend:' \
  | grep -v -e ":$key\$" -e ':latest$' | xargs -r podman rmi >/dev/null 2>&1 || true
podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/metalmend-base:' \
  | grep -v ":$base_key\$" | xargs -r podman rmi >/dev/null 2>&1 || true
echo "$tag"
