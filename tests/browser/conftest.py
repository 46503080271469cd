import os

import pytest

from browser_check import CHROMIUM


def _browser_selected(config):
    expr = config.getoption("markexpr") or ""
    return "browser" in expr and "not browser" not in expr


def pytest_collection_modifyitems(config, items):
    # The browser check builds the book and starts Chromium: it runs only when asked for by marker,
    # as scripts/ci_extra.sh does, never as a side effect of the unit tests.
    if _browser_selected(config):
        return
    skip = pytest.mark.skip(reason="browser check: run `python -m pytest -m browser tests/browser`")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def chromium():
    """Fails (not skips) when the browser check was asked for on a machine without the browser:
    a skip would let CI pass with a missing install step."""
    missing = []
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"{CHROMIUM} (apt-get install -y chromium chromium-driver)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install playwright; never `playwright install`)")
    if missing:
        pytest.fail("browser check needs " + " and ".join(missing) + "; scripts/ci_extra.sh installs both")
    return CHROMIUM
