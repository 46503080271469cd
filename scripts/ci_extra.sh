#!/usr/bin/env bash
# CI beyond the unit tests: student copies and the browser check of the rendered book.
# Called from .ci/run as `bash scripts/ci_extra.sh`; also runs by hand on a developer's machine (as root,
# or with chromium already installed). Installs what it needs from Debian and PyPI only: Debian's chromium
# is the browser; `pip install playwright` brings the driver library, never a browser
# (never `playwright install`: it downloads a browser build, which cannot be fetched here).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
fi
python -c "import playwright.sync_api" 2>/dev/null || python -m pip install -q playwright
echo "ci_extra: $(/usr/bin/chromium --version 2>/dev/null), playwright $(python -m pip show playwright | sed -n 's/^Version: //p')"

# Student copies build into a temporary folder (student/ in the tree is for instructors, git-ignored).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if compgen -G "notebooks/*.ipynb" > /dev/null; then
  python scripts/make_student.py --src notebooks --out "$tmp/student"
else
  echo "ci_extra: no notebooks/*.ipynb yet: no student copies to build"
fi

# Builds the book strict into _build/html (reused if FASTGEN_BOOK_BUILT=1 and fresh), opens every page.
python -m pytest -m browser tests/browser -q
