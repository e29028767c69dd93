#!/usr/bin/env python3
"""`bmoe pull` over one connection against several byte ranges at once.

A stand-in for the Hugging Face Hub on 127.0.0.1 (the listing API and
`resolve` with byte ranges) serves one file of random bytes. Each connection
is paced to a rate, as a CDN paces one stream, or unpaced (loopback speed).
The same pull runs with `--connections 1` and `--connections N` into fresh
caches, alternating, and the script prints the median time of each and their
ratio. Both pulls check the SHA-256 before the file is used, so the times
include the hash.

    scripts/pull-bench.py                      # 512 MiB at 40 MiB/s a connection, then unpaced
    scripts/pull-bench.py --mib 1024 --pace 20 --connections 8 --reps 3
"""

import argparse
import hashlib
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = "bench/pull-GGUF"
NAME = "pull-Q4_K_M.gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def make_handler(data, sha, pace):
    """A request handler serving `data` with a per-connection pace (bytes/s, 0: none)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            path = self.path.split("?")[0]
            if path.startswith("/api/models/"):
                body = json.dumps({
                    "id": REPO,
                    "sha": COMMIT,
                    "siblings": [{"rfilename": NAME, "size": len(data),
                                  "lfs": {"sha256": sha, "size": len(data)}}],
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if not path.endswith("/" + NAME):
                self.send_error(404)
                return
            start, end = 0, len(data)
            wanted = self.headers.get("Range", "")
            if wanted.startswith("bytes="):
                first, _, last = wanted[6:].partition("-")
                start = int(first)
                end = min(int(last) + 1, len(data)) if last else len(data)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            began, sent, piece = time.monotonic(), 0, 256 << 10
            view = memoryview(data)
            while start + sent < end:
                n = min(piece, end - start - sent)
                self.wfile.write(view[start + sent:start + sent + n])
                sent += n
                if pace:
                    ahead = sent / pace - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)

    return Handler


def pull(bmoe, endpoint, connections):
    """One pull into a fresh cache: its wall time in seconds."""
    home = tempfile.mkdtemp(prefix="pull-bench-")
    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME=home)
    env.pop("HF_HUB_OFFLINE", None)
    began = time.monotonic()
    done = subprocess.run([bmoe, "pull", f"{REPO}:{NAME}", "--connections", str(connections)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.monotonic() - began
    shutil.rmtree(home, ignore_errors=True)
    if done.returncode != 0:
        sys.exit(f"pull-bench: bmoe pull --connections {connections} failed:\n{done.stderr}")
    return took


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bmoe", default="target/release/bmoe", help="the bmoe binary")
    parser.add_argument("--mib", type=int, default=512, help="the file's size in MiB")
    parser.add_argument("--pace", type=float, default=40, help="MiB/s a connection (the paced case)")
    parser.add_argument("--connections", type=int, default=4, help="connections of the parallel pull")
    parser.add_argument("--reps", type=int, default=3, help="pulls of each kind per case")
    args = parser.parse_args()

    data = os.urandom(args.mib << 20)
    sha = hashlib.sha256(data).hexdigest()
    print(f"file: {args.mib} MiB; pulls alternate, median of {args.reps} each; times include the SHA-256 check")
    print(f"{'case':<28} {'1 connection':>14} {f'{args.connections} connections':>16} {'speed-up':>9}")
    for pace in (args.pace, 0):
        handler = make_handler(data, sha, pace * (1 << 20))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        one, many = [], []
        for _ in range(args.reps):
            one.append(pull(args.bmoe, endpoint, 1))
            many.append(pull(args.bmoe, endpoint, args.connections))
        server.shutdown()
        a, b = statistics.median(one), statistics.median(many)
        case = f"{pace:g} MiB/s a connection" if pace else "unpaced (loopback)"
        print(f"{case:<28} {a:>12.2f} s {b:>14.2f} s {a / b:>8.2f}x")


if __name__ == "__main__":
    main()
