#!/usr/bin/env bash
# The browser that tests/test_webui_browser.py drives: Debian's chromium, installed with apt-get when it
# is missing and this user may install packages (root, or sudo without a password). Otherwise it says
# why and the browser tests skip (they fail instead where STAGEWISE_REQUIRE_BROWSER=1, as in CI).
set -uo pipefail
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: no chromium and no apt-get here; the web UI's browser tests will skip"
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "setup: no chromium, and installing it needs root; the web UI's browser tests will skip"
  exit 0
fi
echo "setup: installing chromium (apt-get) for the web UI's browser tests"
if ! { "${SUDO[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq chromium; }; then
  echo "setup: apt-get could not install chromium; the web UI's browser tests will skip"
fi
exit 0
