#!/usr/bin/env bash
# PostgreSQL's server binaries for the design store's tests (tests/postgres.py starts a
# throwaway cluster from /usr/lib/postgresql/*/bin on loopback): Debian's package, installed
# as root where missing. Never fails `make`: without them the PostgreSQL cases are skipped,
# and this says why.
set -u
found() { compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; }
found && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; } >/dev/null 2>&1
  found && exit 0
  echo "metalmend: could not install PostgreSQL (apt-get install postgresql); its tests will be skipped"
else
  echo "metalmend: PostgreSQL server binaries missing (as root: apt-get install postgresql); its tests will be skipped"
fi
exit 0
