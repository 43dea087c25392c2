"""Debian's Chromium driven by Playwright, as every browser test uses it.

Never `playwright install`: the browser is Debian's (`.ci/chromium.sh` installs
it in CI). Without it, tests that use the `browser` fixture (tests/conftest.py)
are skipped with a reason, except in CI (CI=true), where they run and fail
loudly. `launch` sets `expect`'s default wait to TIMEOUT_MS: no test depends on
Playwright's 5 s default, which a busy shared machine exceeds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
# No background networking: this machine has no network and Chromium would keep trying.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

#: Every wait of a browser test: actions, navigation and `expect` assertions. Playwright's own default (5 s) is
#: what a page of this app can take on a busy 2-core machine, so no browser test may rely on it.
TIMEOUT_MS = 30_000


def use_explicit_timeouts() -> None:
    """Make `expect(...)` wait TIMEOUT_MS unless a call says otherwise (Playwright's default is 5 s)."""
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)


def require_chromium() -> None:
    """Skip the calling module when Chromium is missing, unless this is CI."""
    if not CHROMIUM.exists() and os.environ.get("CI") != "true":
        pytest.skip(
            "Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium); "
            "in CI (CI=true) this test runs and fails instead.",
            allow_module_level=True,
        )


def launch(playwright):
    """Chromium, with `expect` waiting TIMEOUT_MS by default (pages' own defaults are Playwright's 30 s)."""
    use_explicit_timeouts()
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


def signed_in(browser, url: str, user: str, password: str, *, viewport=(1500, 1000)):
    """A new browser context signed in as `user` through the sign-in page: (context, page), the page on the app."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url, timeout=TIMEOUT_MS)
    page.get_by_label("username").fill(user)
    page.get_by_label("password").fill(password)
    page.get_by_role("button", name="Login").click()
    expect(page.locator("#orapo-whoami")).to_contain_text(f"Signed in as {user}", timeout=TIMEOUT_MS)
    return context, page
