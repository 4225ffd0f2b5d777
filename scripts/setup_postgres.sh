#!/bin/sh
# Install Debian's PostgreSQL server for the tests that run the store on PostgreSQL:
# tests/pg_server.py starts its own throwaway servers from these binaries, on loopback ports, as
# the postgres user the package creates. A no-op when a server (initdb, pg_ctl and postgres) is
# already there: beside PATH's initdb (where the helper looks first) or under any major version
# Debian installs. Root (CI, the dev machines) installs it with apt-get; anyone else is told the
# command. The package also creates Debian's own cluster (15/main, port 5432, started where systemd
# runs): the tests never touch it.
set -eu
server_bin() {
    on_path=$(command -v initdb 2>/dev/null) && on_path=$(dirname "$(readlink -f "$on_path")")
    for bin in ${on_path:+"$on_path"} /usr/lib/postgresql/*/bin; do
        if [ -x "$bin/initdb" ] && [ -x "$bin/pg_ctl" ] && [ -x "$bin/postgres" ]; then
            echo "$bin"
            return 0
        fi
    done
    return 1
}
if server_bin >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "setup_postgres.sh: the PostgreSQL server is missing; run: sudo apt-get install -y postgresql" >&2
    exit 1
fi
# Other apt runs on a shared machine hold dpkg's lock for a while: wait rather than fail.
APT="apt-get -q -o DPkg::Lock::Timeout=600"
DEBIAN_FRONTEND=noninteractive $APT install -y --no-install-recommends postgresql \
    || { $APT update && DEBIAN_FRONTEND=noninteractive $APT install -y --no-install-recommends postgresql; }
bin=$(server_bin) || { echo "setup_postgres.sh: no server binaries under /usr/lib/postgresql/*/bin after the install" >&2; exit 1; }
"$bin/postgres" --version
