#!/usr/bin/env bash
# Install Debian's headless Chromium and its WebDriver for tests/test_browser.py.
#
# For a fresh Debian 12 machine, as root. Idempotent: does nothing when /usr/bin/chromium and
# /usr/bin/chromedriver are both there. Quiet: only its own short lines, on stderr.
# The browser comes from Debian's packages only; nothing downloads a browser build of its own
# (no `playwright install`, no Selenium Manager: the tests point Selenium at /usr/bin/chromedriver).
#   bash .ci/browser.sh
set -euo pipefail

log() { echo "browser.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    log "$(/usr/bin/chromium --version 2>/dev/null || echo chromium) already installed"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "run as root (it installs Debian packages)"
log "installing chromium and chromium-driver from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
# apt's output goes to a log that is shown only when a step fails.
APT_LOG=$(mktemp)
trap 'rm -f "$APT_LOG"' EXIT
apt_quiet() {
    "$@" </dev/null >"$APT_LOG" 2>&1 || { tail -n 30 "$APT_LOG" >&2; return 1; }
}
apt_quiet timeout 600 apt-get update -qq || die "apt-get update failed"
# fonts-liberation: Chromium recommends it; without a font the screenshots show empty boxes.
apt_quiet timeout 900 apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends \
    chromium chromium-driver fonts-liberation || die "apt-get install chromium chromium-driver failed"
[ -x /usr/bin/chromium ] || die "no /usr/bin/chromium after installing chromium"
[ -x /usr/bin/chromedriver ] || die "no /usr/bin/chromedriver after installing chromium-driver"
log "$(/usr/bin/chromium --version 2>/dev/null || echo chromium) installed"
