#!/usr/bin/env bash
# Install Debian's headless Chromium and its ChromeDriver for the browser test of the "Corpus builds" page, when
# they are missing and we may (root with apt). Never fatal: without them the browser test skips and says why.
set -u
if ! command -v chromedriver >/dev/null || ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
fi
command -v chromium >/dev/null && command -v chromedriver >/dev/null \
  || echo "Chromium or ChromeDriver is not available: the browser test will skip"
exit 0
