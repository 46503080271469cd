#!/usr/bin/env bash
# CI beyond the unit tests: student copies and the browser check of the rendered book.
# Called from .ci/run as `bash scripts/ci_extra.sh`; also runs by hand. The browser check needs Debian's
# chromium: installed with apt-get when missing and root (CI); otherwise the check is skipped, in one
# line. `pip install playwright` brings the driver library, never a browser (never
# `playwright install`: it downloads a browser build, which cannot be fetched here).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver ||
    true  # then the check is skipped, below
fi
browser=1
if [ ! -x /usr/bin/chromium ]; then
  browser=0
  echo "ci_extra: browser check SKIPPED: it needs Debian's chromium (run as root, or" \
       "apt-get install chromium chromium-driver)"
else
  python -c "import playwright.sync_api" 2>/dev/null || python -m pip install -q playwright
  echo "ci_extra: $(/usr/bin/chromium --version 2>/dev/null), playwright $(python -m pip show playwright | sed -n 's/^Version: //p')"
fi

# Student copies build into a temporary folder (student/ in the tree is for instructors, git-ignored).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if compgen -G "notebooks/*.ipynb" > /dev/null; then
  python scripts/make_student.py --src notebooks --out "$tmp/student"
else
  echo "ci_extra: no notebooks/*.ipynb yet: no student copies to build"
fi

# Builds the book strict into _build/html (reused if FASTGEN_BOOK_BUILT=1 and fresh), opens every page.
[ "$browser" = 0 ] || python -m pytest -m browser tests/browser -q
