#!/bin/sh
# Install Debian's chromium for tests/test_status_page.py (the status page in a real,
# headless browser). A no-op when it is already there. Root (CI, the dev machines)
# installs it with apt-get; anyone else is told the command.
set -eu
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "setup_chromium.sh: chromium is missing; run: sudo apt-get install -y chromium" >&2
    exit 1
fi
# Other apt runs on a shared machine hold dpkg's lock for a while: wait rather than fail.
APT="apt-get -q -o DPkg::Lock::Timeout=600"
DEBIAN_FRONTEND=noninteractive $APT install -y --no-install-recommends chromium \
    || { $APT update && DEBIAN_FRONTEND=noninteractive $APT install -y --no-install-recommends chromium; }
chromium --version
