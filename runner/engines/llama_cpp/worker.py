"""llama.cpp's server behind a JSON-lines pipe: this worker starts llama-server (its child, in the worker's process
group: closing the worker takes the server down with it) on 127.0.0.1 and sends it each request over HTTP.

    python runner/engines/llama_cpp/worker.py        (any Python 3.10+: the standard library only)

It imports runner/engines/process_worker.py (the loop, the protocol, the serve job's arrivals) and answers
its jobs (see there); what is llama.cpp's is here:
  {"op": "start", "engine": {"server": path, "model": GGUF, "draft": GGUF or null, "spec_type": null |
   "draft-simple" | "ngram-simple", "n_max", "n_min", "p_min", "ngram_n", "slots", "ctx", "threads", "repack",
   "start_timeout_s"}}
        -> {"ok": true, "start_s": seconds until /health answered, "speculative": bool, "llama_cpp": its version}
  {"op": "check", "server": path} -> {"ok": true, "llama_cpp": version} (the binary runs)
A request is POST /completion with the prompt's token ids, streamed, greedy (temperature 0), the prompt cache off,
timings_per_token and return_tokens on: each chunk carries the tokens it sends, tokens_predicted (the request's
count so far) and the request's cumulative draft_n and draft_n_accepted, from which the rows' rounds are made
(runner/engines/llama_cpp/engine.py rounds_of). A token whose bytes end inside a UTF-8 character is never sent by
the server in a stream (its text goes with the next one): such ids are missing from output_ids, and the row's
"ids_lost" says how many (tokens_predicted counts them).

The server dies with the worker (PR_SET_PDEATHSIG on Linux), and the worker's shutdown gives it SERVER_STOP_S after
SIGTERM before SIGKILL: llama-server waits on a stream still open. A server that dies is said with its exit code
and the last line it wrote.
"""
from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runner/engines, for process_worker.py alone
from process_worker import ProcessWorker  # noqa: E402
sys.path.pop(0)
HOST = "127.0.0.1"
SERVER_STOP_S = 3.0  # after SIGTERM, before SIGKILL: what is lost is a stream nobody reads any more


def server_version(server: str) -> str:
    """`llama-server --version`'s version line (it prints it on stderr)."""
    probe = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=60)
    text = [t for t in (probe.stdout + probe.stderr).strip().splitlines() if t.strip()]
    line = next((t for t in text if t.startswith("version")), None)
    if line is None:  # another program (/bin/true prints its own --version)
        raise RuntimeError(f"{server} is not llama.cpp's llama-server: its --version printed no 'version:' line "
                           f"({(text or ['nothing'])[0][:120]!r}, exit code {probe.returncode})")
    if probe.returncode != 0:
        raise RuntimeError(f"{server} --version exited with code {probe.returncode}: {text[-1][:200]}")
    return line.removeprefix("version:").strip()


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def die_with_worker() -> None:
    """In the server, before it runs: SIGKILL when the worker dies (even by SIGKILL), so that no server outlives
    it (Linux; elsewhere the worker's shutdown stops it)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def server_command(engine: dict, port: int) -> list[str]:
    """llama-server's arguments for an engine (its keys: the start job's)."""
    threads = str(engine.get("threads") or os.cpu_count() or 1)
    command = [engine["server"], "-m", engine["model"], "--host", HOST, "--port", str(port),
               "-c", str(engine["ctx"]), "-np", str(engine["slots"]), "-t", threads, "-tb", threads,
               "--no-webui", "-ngl", "0"] + ([] if engine.get("repack", True) else ["-nr"])
    kind = engine.get("spec_type")
    if kind == "draft-simple":
        command += ["-md", engine["draft"], "--spec-type", kind, "-td", threads, "-tbd", threads, "-ngld", "0",
                    "--spec-draft-n-max", str(engine["n_max"]), "--spec-draft-n-min", str(engine["n_min"]),
                    "--spec-draft-p-min", str(engine["p_min"])]
    elif kind == "ngram-simple":
        command += ["--spec-type", kind, "--spec-draft-n-max", str(engine["n_max"]),
                    "--spec-ngram-simple-size-n", str(engine["ngram_n"]),
                    "--spec-ngram-simple-size-m", str(engine["n_max"])]
    elif kind is not None:
        raise ValueError(f"unknown spec_type {kind!r}")
    return command


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


class Worker(ProcessWorker):
    def __init__(self):
        super().__init__()
        self.server: subprocess.Popen | None = None
        self.port: int | None = None
        self.speculative = False
        self.events: queue.Queue = queue.Queue()  # (request, chunk or an error) from the request threads
        self.open: set[str] = set()  # requests whose stream has not ended
        self.connections: dict[str, http.client.HTTPConnection] = {}  # request -> its stream's connection
        self.last_line = ""  # the server's last line of output, for the message when it dies
        self.forwarder: threading.Thread | None = None  # _forward's thread: it has read it all once it ends

    def ready(self) -> bool:
        """A server was started (it may have died since: engine_dead)."""
        return self.server is not None

    def engine_dead(self) -> bool:
        return self.server is not None and self.server.poll() is not None

    def died(self) -> str:
        code = self.server.poll() if self.server is not None else None
        if code is not None and self.forwarder is not None:
            self.forwarder.join(timeout=2)  # its last words, still in the pipe
        return (f"llama-server died ({exit_text(code) if code is not None else 'gone'}); its last line: "
                f"{self.last_line[:300] or '(none)'}")

    def shutdown(self) -> None:
        server, self.server = self.server, None
        if server is None:
            return
        self.abort(list(self.connections))
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=SERVER_STOP_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)

    def _forward(self, stream) -> None:
        """The server's output to the worker log, its last line kept."""
        for raw in stream:
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            if line.strip():
                self.last_line = line.strip()
        sys.stderr.flush()

    def check(self, job: dict) -> dict:
        return {"ok": True, "llama_cpp": server_version(job["server"])}

    def start(self, job: dict) -> dict:
        self.shutdown()
        engine = dict(job.get("engine") or {})
        version = server_version(engine["server"])
        self.port = free_port()
        timeout = float(engine.get("start_timeout_s") or 600)
        began = time.perf_counter()
        # its output goes to the worker's stderr (the worker log) through _forward; stdin closed: it never reads the
        # pipe of our jobs
        self.last_line = ""
        self.server = subprocess.Popen(server_command(engine, self.port), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=die_with_worker)
        self.forwarder = threading.Thread(target=self._forward, args=(self.server.stdout,), daemon=True)
        self.forwarder.start()
        while True:
            if self.server.poll() is not None:
                self.forwarder.join(timeout=2)  # its last words
                code, self.server = self.server.returncode, None
                if code in (-signal.SIGILL, -signal.SIGSEGV) and engine.get("repack", True):
                    # b11434 built for a CPU with AMX, in a VM: SIGILL, or SIGSEGV at its threadpool's start
                    raise RuntimeError(f"llama-server died while starting ({exit_text(code)}): its weight repacking "
                                       "for this CPU does not run here (seen with AMX in a VM); set "
                                       "llama_cpp.repack: false")
                raise RuntimeError(f"llama-server exited while starting ({exit_text(code)}); its last line: "
                                   f"{self.last_line[:300] or '(none)'}")
            if time.perf_counter() - began > timeout:
                self.shutdown()
                raise RuntimeError(f"llama-server did not answer /health within {timeout:g} s of its start "
                                   f"(llama_cpp.start_timeout_s); its last line: {self.last_line[:300] or '(none)'}")
            try:
                status, _ = self._get("/health")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        self.speculative = engine.get("spec_type") is not None
        return {"ok": True, "start_s": time.perf_counter() - began, "speculative": self.speculative,
                "llama_cpp": version}

    def _get(self, path: str) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(HOST, self.port, timeout=10)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def check_concurrency(self, concurrency: int) -> None:
        status, body = self._get("/props")
        slots = json.loads(body).get("total_slots") if status == 200 else None
        if slots is not None and concurrency > slots:
            raise ValueError(f"concurrency {concurrency} exceeds the server's slots ({slots}): llama.cpp would queue "
                             "the rest itself; start it with as many slots as the concurrency")

    def sampling(self, job: dict) -> dict:
        if job.get("temperature") not in (None, 0, 0.0):
            raise ValueError("the llama.cpp worker runs greedy only (temperature null)")
        return {"n_predict": int(job["max_new_tokens"]), "temperature": 0.0, "seed": int(job.get("seed") or 0),
                "stream": True, "return_tokens": True, "timings_per_token": True, "cache_prompt": False,
                "ignore_eos": False}

    # the requests run in threads (one HTTP stream each); step() hands on what their chunks brought
    def add(self, request: str, prompt: list[int], params: dict) -> None:
        if self.engine_dead():
            raise RuntimeError(self.died())
        self.open.add(request)
        body = json.dumps({**params, "prompt": prompt}).encode()
        threading.Thread(target=self._stream, args=(request, body), daemon=True).start()

    def _stream(self, request: str, body: bytes) -> None:
        connection = http.client.HTTPConnection(HOST, self.port)
        self.connections[request] = connection
        try:
            connection.request("POST", "/completion", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status != 200:
                raise RuntimeError(f"llama-server answered {response.status}: {response.read()[:300]!r}")
            for line in response:
                if line.startswith(b"data: "):
                    chunk = json.loads(line[6:])
                    if not isinstance(chunk, dict):
                        continue
                    self.events.put((request, chunk))
                    if chunk.get("stop"):
                        return
            raise RuntimeError("llama-server ended a stream without its final chunk")
        except Exception as error:  # noqa: BLE001 - handed to step(), which raises it in the main thread
            self.events.put((request, error))
        finally:
            self.connections.pop(request, None)
            connection.close()

    def in_flight(self) -> bool:
        return bool(self.open)

    def step(self) -> list:
        """What the streams brought since the last step: the first chunk waited for, then every one already there."""
        chunks = [self.events.get(timeout=3600)]
        while True:
            try:
                chunks.append(self.events.get_nowait())
            except queue.Empty:
                break
        out = []
        for request, chunk in chunks:
            if request not in self.open:  # an aborted request's stream, cut by abort()
                continue
            if isinstance(chunk, BaseException):
                try:  # a stream cut by the server's death: say that, not the connection's error
                    self.server.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    raise chunk from None
                raise RuntimeError(self.died()) from None
            if chunk.get("stop"):
                self.open.discard(request)
            self.chunks.setdefault(request, []).append(chunk)
            out.append((request, [int(t) for t in chunk.get("tokens") or []], bool(chunk.get("stop")), chunk))
        return out

    def run(self, *args, **kwargs) -> dict:
        self.chunks: dict[str, list[dict]] = {}  # request -> its chunks, for row()
        return super().run(*args, **kwargs)

    def abort(self, requests: list[str]) -> None:
        """The server ends a request whose connection closes."""
        self.open.difference_update(requests)
        for request in requests:
            connection = self.connections.get(request)
            sock = getattr(connection, "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def row(self, final: dict, ids: list[int], steps: list[int], times: dict) -> dict:
        """One request's answer: its ids, llama.cpp's final timings and stop, and per chunk (tokens_predicted,
        draft_n, draft_n_accepted) for its rounds."""
        request = next(r for r, chunks in self.chunks.items() if chunks and chunks[-1] is final)
        counts = [[int(c.get("tokens_predicted") or 0), int((c.get("timings") or {}).get("draft_n") or 0),
                   int((c.get("timings") or {}).get("draft_n_accepted") or 0)] for c in self.chunks[request]]
        predicted = int(final.get("tokens_predicted") or len(ids))
        stop = final.get("stop_type")
        return {"output_ids": ids, "new_tokens": predicted, "ids_lost": predicted - len(ids), "steps": steps,
                "stop_reason": {"eos": "eos", "limit": "length"}.get(stop, stop), "finish_reason": stop,
                "timings": final.get("timings"), "counts": counts, **times}


if __name__ == "__main__":
    sys.exit(Worker().main())
