#!/usr/bin/env bash
# Make Debian's Chromium available for the browser tests (never a browser
# download of Playwright's own). Installs the package when missing and we are root.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "chromium_missing: install Debian's chromium package to run the browser tests." >&2; exit 3; fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq chromium >&2
