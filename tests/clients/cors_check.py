"""A browser app on another origin calls `bmoe serve`: a page served from
this script's own HTTP server (another port, so another origin) runs
fetch() with an Authorization header in headless Chromium, which sends a
CORS preflight first. The server started with --cors naming the page's
origin answers; the one naming another origin is refused by the browser.

usage: cors_check.py PAGE_PORT ALLOWED_URL REFUSED_URL KEY

Run by tests/serve_page.rs; exits 0 when every check passed."""

import http.server
import sys
import threading

from page_check import start_browser

PAGE = b"<!doctype html><title>another origin</title><p>an app served elsewhere</p>"


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args):
        pass


CALL = """
const [url, key, done] = arguments;
fetch(url + "/v1/chat/completions", {
  method: "POST",
  headers: {"Authorization": "Bearer " + key, "Content-Type": "application/json"},
  body: JSON.stringify({messages: [{role: "user", content: "hi"}], max_tokens: 2}),
}).then(r => r.json().then(j => done({status: r.status, object: j.object || null})))
  .catch(e => done({error: String(e)}));
"""


def check(ok, what):
    if not ok:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main():
    page_port, allowed, refused, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", page_port), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    driver = start_browser()
    try:
        driver.set_script_timeout(120)
        driver.get(f"http://127.0.0.1:{page_port}/")
        answer = driver.execute_async_script(CALL, allowed, key)
        check(answer.get("status") == 200 and answer.get("object") == "chat.completion", f"allowed origin: {answer}")
        answer = driver.execute_async_script(CALL, refused, key)
        check("error" in answer, f"a server that does not name the page's origin was readable: {answer}")
        print("cors: the named origin's app called the API; another origin was refused")
    finally:
        driver.quit()
        server.shutdown()


if __name__ == "__main__":
    main()
