"""What an endpoint's reply can cost a caller: the shared OpenAI client (tunestudio/openai_client.py, the judge's
settings) against a plain `httpx.post(..., timeout=T)`, the judge's call before issue 38 finding 4.

Two scripted endpoints on loopback: one sends a 300 MB reply (no Content-Length, until close), one sends a space
every 0.5 s for up to 20 s. Each call runs in a fresh child process, so its peak RSS is its own.

    .venv/bin/python bench/openai_client_limits.py [--mb 300] [--deadline 2]

Targets: a 300 MB reply costs the caller under 50 MB of peak RSS; a trickle ends within the deadline (+0.5 s).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MESSAGES = [{"role": "user", "content": "which?"}]


class Endpoint(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    size = 300 * 1024 * 1024

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        model = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["model"]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            if model == "huge":
                chunk, sent = b" " * (1 << 20), 0
                while sent < self.size:
                    self.wfile.write(chunk)
                    sent += len(chunk)
            else:  # trickle
                for _ in range(40):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.5)
        except OSError:
            pass
        self.close_connection = True


def child(way: str, url: str, model: str, deadline: float) -> None:
    """One call, then a JSON line: how it ended, its seconds, and this process's peak RSS before and after."""
    import httpx

    from tunestudio.judge.endpoint import MAX_VERDICT_BYTES
    from tunestudio.openai_client import OpenAIClient

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.monotonic()
    try:
        if way == "plain":
            body = {"model": model, "messages": MESSAGES}
            reply = httpx.post(f"{url}/chat/completions", json=body, timeout=deadline)
            said = f"answered {len(reply.content):,} bytes"
        else:
            OpenAIClient(url, deadline_s=deadline, max_reply_bytes=MAX_VERDICT_BYTES).chat(model, MESSAGES)
            said = "answered"
    except Exception as exc:
        said = f"{type(exc).__name__}: {str(exc)[:100]}"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"way": way, "model": model, "seconds": round(time.monotonic() - start, 2),
                      "rss_before_mib": round(before), "rss_peak_mib": round(peak), "said": said}))


def measure(way: str, url: str, model: str, deadline: float) -> dict:
    run = subprocess.run([sys.executable, __file__, "--child", way, url, model, str(deadline)], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--deadline", type=float, default=2.0)
    parser.add_argument("--child", nargs=4)
    args = parser.parse_args()
    if args.child:
        way, url, model, deadline = args.child
        child(way, url, model, float(deadline))
        return
    Endpoint.size = args.mb * 1024 * 1024
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    results = [measure(way, url, model, args.deadline) for model in ("huge", "trickle") for way in ("plain", "client")]
    for r in results:
        print(f"{r['model']:8} {r['way']:7} {r['seconds']:6.2f} s  peak RSS {r['rss_peak_mib']:5} MiB "
              f"(start {r['rss_before_mib']} MiB)  {r['said']}")
    server.shutdown()
    print(json.dumps({"mb": args.mb, "deadline_s": args.deadline, "results": results}))


if __name__ == "__main__":
    main()
