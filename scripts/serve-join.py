#!/usr/bin/env python3
"""One client streams a reply from a `bmoe serve` while others join: once
the stream's first 20 tokens have arrived, JOINERS clients each send a
prompt of about PROMPT_TOKENS token ids (8 tokens each). Prints one JSON
line: the stream's gaps between tokens (median before the others joined,
median overall, p99, longest, in ms), the longest gap against each median,
and each joiner's time to its answer. Standard library only.

usage: scripts/serve-join.py URL [STREAM_TOKENS] [PROMPT_TOKENS] [JOINERS]
"""

import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def post(url, body):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return c.getresponse()


def stream(url, tokens, arrivals, running):
    r = post(url, {"prompt": "The history of the river", "max_tokens": tokens, "temperature": 0, "stream": True})
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk["choices"] and chunk["choices"][0]["text"]:
            arrivals.append(time.perf_counter())
            if len(arrivals) == 20:
                running.set()
    running.set()


def join(url, seed, prompt_tokens, answered):
    rng = random.Random(seed)
    ids = [rng.randrange(300, 1000) for _ in range(prompt_tokens)]
    start = time.perf_counter()
    post(url, {"prompt": ids, "max_tokens": 8, "temperature": 0}).read()
    answered[seed] = time.perf_counter() - start


def main():
    url = sys.argv[1]
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    prompt_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 1500
    joiners = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    arrivals, running, answered = [], threading.Event(), {}
    streamer = threading.Thread(target=stream, args=(url, tokens, arrivals, running))
    streamer.start()
    running.wait()
    joined = time.perf_counter()
    threads = [threading.Thread(target=join, args=(url, i, prompt_tokens, answered)) for i in range(joiners)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    streamer.join()
    gaps = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:])]
    before = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:]) if b <= joined]
    median, median_before, longest = statistics.median(gaps), statistics.median(before), max(gaps)
    print(json.dumps({
        "tokens": len(arrivals), "gap_median_before_ms": round(median_before, 1), "gap_median_ms": round(median, 1),
        "gap_p99_ms": round(sorted(gaps)[int(0.99 * (len(gaps) - 1))], 1), "gap_max_ms": round(longest, 1),
        "max_over_median": round(longest / median, 2), "max_over_median_before": round(longest / median_before, 2),
        "stream_s_after_join": round(arrivals[-1] - joined, 2),
        "joiners_s": [round(answered[i], 2) for i in range(joiners)],
    }))


if __name__ == "__main__":
    main()
