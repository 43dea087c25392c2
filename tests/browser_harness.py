"""Debian's Chromium driven by Playwright, as every browser test uses it.

Never `playwright install`: the browser is Debian's (`.ci/chromium.sh` installs
it in CI). Without it, tests that import this module are skipped with a reason,
except in CI (CI=true), where they run and fail loudly.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).parent / "artifacts"
# No background networking: this machine has no network and Chromium would keep trying.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def require_chromium() -> None:
    """Skip the calling module when Chromium is missing, unless this is CI."""
    if not CHROMIUM.exists() and os.environ.get("CI") != "true":
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium); "
                    "in CI (CI=true) this test runs and fails instead.", allow_module_level=True)


def launch(playwright):
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()
