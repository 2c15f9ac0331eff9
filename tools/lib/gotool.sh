# Shared by tools/helm, tools/kwok and tools/prometheus build.sh (sourced, not run): build one Go
# command from a pinned module into a cache directory keyed by its version.
#
#   gotool_override NAME VALUE          VALUE (an env var's) names a binary to use instead:
#                                       print it and exit; refuse one that is not executable
#   gotool_build NAME DIR MODULE VERSION PACKAGE LDFLAGS
#       checks that DIR/go.mod pins MODULE at VERSION and that go is on PATH, then builds
#       PACKAGE with LDFLAGS into "$gotool_tmp/NAME" (a temporary directory under the
#       cache, removed on exit: an interrupted build never leaves a half-written binary
#       that a later run would trust). The caller moves what it keeps into place.
# The caller sets "cache" (the cache root of this tool) before calling gotool_build, and may
# set "gotool_tags" (Go build tags) to leave parts of a big command out.

gotool_fail() {
  echo "metalmend: $*" >&2
  exit 1
}

gotool_override() {
  local name="$1" value="$2" var
  var="METALMEND_$(echo "$name" | tr '[:lower:]' '[:upper:]')"
  [ -n "$value" ] || return 0
  [ -x "$value" ] || gotool_fail "$var=$value is not an executable"
  echo "$value"
  exit 0
}

gotool_build() {
  local name="$1" dir="$2" module="$3" version="$4" package="$5" ldflags="$6"
  local var
  var="METALMEND_$(echo "$name" | tr '[:lower:]' '[:upper:]')"
  grep -q "$module $version\b" "$dir/go.mod" \
    || gotool_fail "tools/$(basename "$dir")/go.mod does not pin $module $version (versions.env)"
  command -v go >/dev/null 2>&1 \
    || gotool_fail "cannot build $name: 'go' is not on PATH (install Go >= 1.26, or set $var)"
  mkdir -p "$cache"
  gotool_tmp="$(mktemp -d "$cache/.build.XXXXXX")"
  # shellcheck disable=SC2064  # the path is fixed now, on purpose
  trap "rm -rf '$gotool_tmp'" EXIT
  echo "metalmend: building $name $version (first use only; takes a few minutes)" >&2
  if ! (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 10 go build -trimpath \
        -tags "${gotool_tags:-}" -ldflags "$ldflags" -o "$gotool_tmp/$name" "$package") >"$gotool_tmp/build.log" 2>&1; then
    tail -n 20 "$gotool_tmp/build.log" >&2
    gotool_fail "'go build' of $name failed (log above)"
  fi
}
