"""A stand-in for llama.cpp's llama-server (its --version, /health, /props and streamed /completion), so that the
engine's worker, records and figures are tested where llama.cpp is not built. Its text is a fixed function of the
prompt: token i of a row is (sum(prompt) + 7 i) % 50 + 10 (greedy, every method the same tokens). With
--spec-type it drafts --spec-draft-n-max tokens a step of which it accepts the first two (one where fewer are left),
sends each step's tokens one chunk each with the cumulative draft_n and draft_n_accepted, and withholds the chunk of
every 9th token (as the server does for a token that ends inside a UTF-8 character), or of the tokens at the 1-based
positions FAKE_LLAMA_WITHHOLD lists (e.g. "1,4,5": the prefill's, a round's last and the next round's first).
With FAKE_LLAMA_CRASH=SIGILL (or SIGSEGV) it dies of that signal at its start unless -nr (no weight repacking) is given.

Faults, for the worker's handling of them (each by an environment variable):
- FAKE_LLAMA_START=exit: it passes --version, then exits 1 at its start with a line on stderr; =hang: it never answers.
- FAKE_LLAMA_DIE_AT=N: a request of N new tokens kills it (exit code 3, a last line on stderr) after 3 chunks.
- FAKE_LLAMA_SLOW_AT=N: a request of N new tokens streams a chunk a second, and SIGTERM waits for open streams to end
  (as llama-server's does); FAKE_LLAMA_MARK names a file each such stream appends "pid parent-pid" to as it starts."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def arg(name: str, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


if "--version" in sys.argv:
    print("version: 1 (fake)", file=sys.stderr)
    sys.exit(0)
if os.environ.get("FAKE_LLAMA_CRASH") and "-nr" not in sys.argv:  # a repacking kernel this machine cannot run
    os.kill(os.getpid(), getattr(signal, os.environ["FAKE_LLAMA_CRASH"]))
if os.environ.get("FAKE_LLAMA_START") == "exit":
    print("fake: error loading model: tensor 'output.weight' has wrong shape", file=sys.stderr, flush=True)
    sys.exit(1)
if os.environ.get("FAKE_LLAMA_START") == "hang":
    time.sleep(3600)
DIE_AT, SLOW_AT = int(os.environ.get("FAKE_LLAMA_DIE_AT", -1)), int(os.environ.get("FAKE_LLAMA_SLOW_AT", -1))
streaming = {"open": 0, "stopping": False}


def on_sigterm(signum, frame):
    if not streaming["open"]:
        os._exit(0)
    streaming["stopping"] = True  # an open stream first


if SLOW_AT > 0:
    signal.signal(signal.SIGTERM, on_sigterm)
SLOTS, GAMMA, SPEC = int(arg("-np", 1)), int(arg("--spec-draft-n-max", 0)), arg("--spec-type")
EOS = int(arg("--fake-eos", -1))
WITHHOLD = {int(x) for x in os.environ["FAKE_LLAMA_WITHHOLD"].split(",")} if os.environ.get("FAKE_LLAMA_WITHHOLD") \
    else None


def withheld(position: int) -> bool:
    return position in WITHHOLD if WITHHOLD is not None else position % 9 == 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, body: dict):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._json({"status": "ok"} if self.path == "/health" else {"total_slots": SLOTS})

    def do_POST(self):
        job = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, n = job["prompt"], job["n_predict"]
        tokens = [(sum(prompt) + 7 * i) % 50 + 10 for i in range(n)]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        drafted = accepted = 0
        steps = [[tokens[0]]]
        i = 1
        while i < n:  # each step: one target forward's tokens
            take = min(3, n - i) if SPEC else 1
            if SPEC:
                drafted, accepted = drafted + GAMMA, accepted + min(2, take - 1)
            steps.append((tokens[i:i + take], drafted, accepted))
            i += take
        chunks, predicted = [], 0
        for step in steps:
            ids, d, a = (step, 0, 0) if isinstance(step[0], int) else step
            for token in ids:
                predicted += 1
                if withheld(predicted):
                    continue  # a token whose bytes end inside a character: never sent
                timings = {"draft_n": d, "draft_n_accepted": a} if d else {}
                chunks.append({"content": "", "tokens": [token], "stop": False, "tokens_predicted": predicted,
                               "timings": timings})
        chunks.append({"content": "", "tokens": [], "stop": True, "tokens_predicted": n, "stop_type": "limit",
                       "timings": {"prompt_ms": 5.0, "predicted_ms": 2.0 * n, "predicted_n": n,
                                   **({"draft_n": drafted, "draft_n_accepted": accepted} if SPEC else {})}})
        if n == SLOW_AT and os.environ.get("FAKE_LLAMA_MARK"):
            with open(os.environ["FAKE_LLAMA_MARK"], "a") as mark:
                mark.write(f"{os.getpid()} {os.getppid()}\n")
        streaming["open"] += 1
        try:
            for index, chunk in enumerate(chunks):
                if n == DIE_AT and index == 3:
                    print("fake: GGML_ASSERT(n_tokens <= n_batch) failed", file=sys.stderr, flush=True)
                    os._exit(3)
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                time.sleep(1.0 if n == SLOW_AT else 0.001)
        finally:
            streaming["open"] -= 1
            if streaming["stopping"] and not streaming["open"]:
                os._exit(0)
        self.close_connection = True


ThreadingHTTPServer(("127.0.0.1", int(arg("--port"))), Handler).serve_forever()
