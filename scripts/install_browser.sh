#!/usr/bin/env bash
# The browser the end-to-end page tests drive (tests/app/test_web_browser.py): Debian's Chromium and
# its ChromeDriver. `make test` runs this first. Already there: nothing to do. Missing: installed with
# apt-get when this user may (root, or sudo without a password); otherwise it says so and the browser
# tests skip with the same message. Never fails the build: a machine without a browser still tests
# everything else.
set -u
have() { command -v "$1" >/dev/null 2>&1; }
browser() { have chromium || have chromium-browser || have google-chrome; }
if browser && have chromedriver; then
    exit 0
fi
if ! have apt-get; then
    echo "install_browser: no Chromium/ChromeDriver and no apt-get here; the browser tests will skip" >&2
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    SUDO=""
elif have sudo && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "install_browser: Chromium is missing and installing it needs root:" \
         "sudo apt-get install chromium chromium-driver; the browser tests will skip" >&2
    exit 0
fi
echo "install_browser: installing Debian's chromium and chromium-driver (about a minute)"
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; }; then
    echo "install_browser: apt-get could not install chromium; the browser tests will skip" >&2
fi
exit 0
