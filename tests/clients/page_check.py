"""Drives `bmoe serve`'s chat page in headless Chromium: sends one message,
waits for the streamed reply to finish and for the routing panel to have
received step events, then saves a screenshot (and a second one in the dark
colour scheme, next to it with `-dark` in its name).

usage: page_check.py BASE_URL SCREENSHOT.png

Run by tests/serve_page.rs. Exits 0 when every check passed; otherwise
prints what was missing and the browser's console log, and exits 1."""

import os
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
REPLY_TIMEOUT = 300


def start_browser():
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def wait_for(what, timeout, probe):
    """Polls probe() until it returns something true (an element not there
    yet counts as false); the failure names `what`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except WebDriverException:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def finished_reply(driver):
    """The first finished assistant reply with text, or None."""
    for el in driver.find_elements(By.CSS_SELECTOR, ".assistant.done"):
        if (el.get_attribute("textContent") or "").strip():
            return el
    return None


def steps(driver):
    return int(driver.find_element(By.ID, "panel").get_attribute("data-steps") or "0")


def console_errors(entries):
    """The console's errors, apart from the browser asking for a favicon."""
    return [e for e in entries if e.get("level") == "SEVERE" and "favicon.ico" not in e.get("message", "")]


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    base, shot = sys.argv[1].rstrip("/"), sys.argv[2]
    os.makedirs(os.path.dirname(os.path.abspath(shot)), exist_ok=True)
    driver = start_browser()
    log = []
    try:
        driver.get(base + "/")
        # The page shows the model and connects its event stream on its own.
        wait_for("the panel's event stream to connect (#panel[data-connected=1])", 60,
                 lambda: driver.find_element(By.ID, "panel").get_attribute("data-connected") == "1")
        wait_for("the model line (#model) to name the model", 60,
                 lambda: "layers" in driver.find_element(By.ID, "model").text)
        box = driver.find_element(By.ID, "input")
        box.send_keys("Which experts answer this?")
        driver.find_element(By.ID, "send").click()

        reply = wait_for("a finished assistant reply with text (.assistant.done)", REPLY_TIMEOUT,
                         lambda: finished_reply(driver))
        wait_for("step events on the routing panel (#panel data-steps > 0)", 30, lambda: steps(driver) > 0)
        # The panel drew them: the speed figure and the grid's description.
        wait_for("a decode speed on the panel (#f-tps)", 10,
                 lambda: any(c.isdigit() for c in driver.find_element(By.ID, "f-tps").text))
        wait_for("the routing grid to describe a step", 10,
                 lambda: "routed experts" in (driver.find_element(By.ID, "grid").get_attribute("aria-label") or ""))
        user = driver.find_elements(By.CSS_SELECTOR, ".msg.user")
        assert user and "Which experts" in user[0].text, "the user's message is not in the log"
        assert not driver.find_elements(By.CSS_SELECTOR, ".msg.error"), "the page shows an error: " + \
            " / ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, ".msg.error"))

        driver.save_screenshot(shot)
        # The same page in the dark scheme.
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                               {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        time.sleep(0.5)
        stem, ext = os.path.splitext(shot)
        driver.save_screenshot(stem + "-dark" + ext)

        log = driver.get_log("browser")
        errors = console_errors(log)
        assert not errors, "the page logged errors: " + "; ".join(e["message"] for e in errors)
        text = reply.get_attribute("textContent").strip()
        print(f"ok: reply of {len(text)} characters, {steps(driver)} step events, screenshot {shot}")
        return 0
    except Exception as e:  # noqa: BLE001 - any failure is reported the same way
        message = e.msg if isinstance(e, WebDriverException) else e
        print(f"FAILED: {message}", file=sys.stderr)
        try:
            status = driver.find_element(By.ID, "status").text
            print(f"the page's status line: {status!r}", file=sys.stderr)
        except WebDriverException:
            print("(the page has no status line: was it the chat page?)", file=sys.stderr)
        try:
            log = log or driver.get_log("browser")
            driver.save_screenshot(shot)
            print(f"(screenshot of the failure: {shot})", file=sys.stderr)
        except Exception:  # noqa: BLE001
            pass
        print("browser console:", file=sys.stderr)
        for entry in log:
            print(f"  {entry.get('level')} {entry.get('message')}", file=sys.stderr)
        return 1
    finally:
        driver.quit()


if __name__ == "__main__":
    sys.exit(main())
