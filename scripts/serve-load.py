#!/usr/bin/env python3
"""Sends N streamed greedy completions at once to a `bmoe serve` and prints
one JSON line: aggregate tok/s, time to first token and inter-token latency
(p50, p99, ms), and MiB of experts read per generated token (from /metrics
before and after). Standard library only.

usage: scripts/serve-load.py URL N [TOKENS]
"""

import http.client
import json
import sys
import threading
import time
import urllib.parse


def metrics(url):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    c.request("GET", "/metrics")
    values = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            values[name] = float(value)
    return values


def one(url, prompt, tokens, out):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    start = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    arrivals, usage = [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        elif chunk["choices"] and chunk["choices"][0]["text"]:
            arrivals.append(time.perf_counter())
    out.append({"start": start, "end": time.perf_counter(), "arrivals": arrivals,
                "tokens": usage["completion_tokens"] if usage else len(arrivals)})


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    url, n = sys.argv[1], int(sys.argv[2])
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    before = metrics(url)
    results = []
    threads = [threading.Thread(target=one, args=(url, f"Request {i}: the history of river number {i}", tokens, results))
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = metrics(url)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    generated = sum(r["tokens"] for r in results)
    ttft = [(r["arrivals"][0] - r["start"]) * 1000 for r in results if r["arrivals"]]
    itl = [(b - a) * 1000 for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    read = after["bmoe_expert_bytes_read_total"] - before["bmoe_expert_bytes_read_total"]
    print(json.dumps({
        "n": n, "tokens": generated, "wall_s": round(wall, 3), "tok_s": round(generated / wall, 2),
        "mib_per_token": round(read / 1048576 / max(generated, 1), 3),
        "ttft_p50_ms": round(pct(ttft, 50), 1), "ttft_p99_ms": round(pct(ttft, 99), 1),
        "itl_p50_ms": round(pct(itl, 50), 1), "itl_p99_ms": round(pct(itl, 99), 1),
    }))


if __name__ == "__main__":
    main()
