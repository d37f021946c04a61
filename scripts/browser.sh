#!/usr/bin/env bash
# scripts/browser.sh: makes sure a headless Chromium is installed for the
# browser tests (the report and the live view, driven over the Chrome
# DevTools Protocol by chromedp), and prints its path. It installs Debian's
# chromium package with apt-get when it is missing (as root, or through
# sudo without a password); `make test` calls it before the Go tests.
#
# Exit status 0 and the path on stdout when a browser is there; 1 with the
# reason on stderr otherwise: the browser tests then skip, saying so (set
# RLLM_REQUIRE_BROWSER=1 to make them fail instead).
#
# Environment:
#   RLLM_CHROMIUM  a browser to use instead (checked, never installed)
set -euo pipefail

find_browser() {
	if [ -n "${RLLM_CHROMIUM:-}" ]; then
		[ -x "$RLLM_CHROMIUM" ] && { echo "$RLLM_CHROMIUM"; return 0; }
		echo "browser.sh: RLLM_CHROMIUM=$RLLM_CHROMIUM is not executable" >&2
		return 1
	fi
	for b in chromium chromium-browser google-chrome-stable google-chrome headless-shell; do
		if p=$(command -v "$b" 2>/dev/null); then
			echo "$p"
			return 0
		fi
	done
	return 1
}

if find_browser; then
	exit 0
fi
[ -n "${RLLM_CHROMIUM:-}" ] && exit 1

as_root=()
if [ "$(id -u)" != 0 ]; then
	if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		as_root=(sudo -n)
	else
		echo "browser.sh: Chromium is not installed and installing it needs root (apt-get install chromium): browser tests will skip" >&2
		exit 1
	fi
fi
if ! command -v apt-get >/dev/null; then
	echo "browser.sh: Chromium is not installed and there is no apt-get here: install chromium, or set RLLM_CHROMIUM; browser tests will skip" >&2
	exit 1
fi
echo "browser.sh: installing Debian's chromium package (once)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! "${as_root[@]}" apt-get install -y -q --no-install-recommends chromium >&2; then
	"${as_root[@]}" apt-get update -q >&2 || true
	"${as_root[@]}" apt-get install -y -q --no-install-recommends chromium >&2 ||
		{ echo "browser.sh: apt-get install chromium failed: browser tests will skip" >&2; exit 1; }
fi
find_browser || { echo "browser.sh: chromium installed but not found on PATH" >&2; exit 1; }
