"""Headless Chromium's screenshots of the pages, for ``test-artifacts/``."""

from __future__ import annotations

from pathlib import Path


def full_page_screenshot(browser, path: Path) -> None:
    """The whole page, not only what the window shows: the viewport is made as tall as the page for the shot."""
    path.parent.mkdir(exist_ok=True)
    size = browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
    )
    metrics = {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": False}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        browser.save_screenshot(str(path))
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
