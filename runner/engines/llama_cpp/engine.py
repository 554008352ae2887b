"""llama.cpp as a third engine in the same run: the llama_cpp_* points run in llama.cpp's server (llama-server, built
by .ci/llama-cpp-env), one server per point, started by a worker process (runner/engines/llama_cpp/worker.py) on
127.0.0.1. runner/engines/process.py runs the workers, their pairing, warmup and drift probes; what is llama.cpp's
is here: the check of its binary, the GGUF files it loads (as they are, or re-quantized by its llama-quantize), a
point's server arguments and the records from its answers, their rounds from its own counters.

A llama_cpp_* point's ratios are against llama_cpp_generate on the same prompts (eval pairs each engine with its
own reference). Every server starts with as many slots as the run's largest batch or concurrency.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from decode.methods import REGISTRY
from eval.records import Point
from runner.engines.process import ProcessExecutor, WorkerProcess, checking_worker, max_concurrency
from utils import UserError

WORKER = Path(__file__).with_name("worker.py")
CHECK_TIMEOUT_S = 120.0
QUANTIZE_TIMEOUT_S = 1800.0
SERVER_OVERHEAD_BYTES = 512 * 2**20  # a server's KV cache, compute buffers and the worker
QUANT_TYPES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_k_m": "Q4_K_M"}  # llama_cpp.weights -> llama-quantize's


class LlamaCppProcess(WorkerProcess):
    script, title = WORKER, "the llama.cpp worker"
    cannot_run = "{python} cannot run the llama.cpp worker ({error})"


def server_path(config) -> str:
    """llama_cpp.server, else $SPECULATE_LLAMA_SERVER, else llama-server on PATH; one line when none runs."""
    given = config.llama_cpp.server or os.environ.get("SPECULATE_LLAMA_SERVER")
    path = shutil.which(given or "llama-server") if not given or "/" not in given else str(Path(given).expanduser())
    if not path or not (Path(path).is_file() and os.access(path, os.X_OK)):
        raise UserError(f"llama_cpp.server: {given or 'llama-server (on PATH)'} is not an executable file; build "
                        "llama.cpp's server with `.ci/llama-cpp-env DIR` (~20 min on 2 cores) and set "
                        "llama_cpp.server: DIR/bin/llama-server, or drop the llama_cpp_* methods")
    return str(Path(path).absolute())


def gguf_of(cfg, role: str) -> Path:
    """The GGUF file a model config names: an offline model's (joined from its packages, checked, kept in the cache),
    a .gguf file, or a folder's gguf_file. Anything else is refused with one line."""
    from utils.models import locate
    from utils.offline_models import OFFLINE_MODELS, offline_gguf

    if cfg.model in OFFLINE_MODELS:
        return offline_gguf(cfg.model)
    if not cfg.model.startswith("synthetic:"):
        where, gguf_file, _ = locate(cfg)
        path = Path(where) if Path(where).suffix == ".gguf" else Path(where) / gguf_file if gguf_file else None
        if path is not None and path.is_file():
            return path.absolute()
    raise UserError(f"{role}.model: {cfg.model} is not a GGUF file; the llama_cpp_* methods load GGUF: give a .gguf "
                    "file, a folder with gguf_file, or an offline model, or drop the llama_cpp_* methods")


def quantized(source: Path, weights: str, server: str) -> Path:
    """The GGUF the server loads at llama_cpp.weights: the file as it is, or re-quantized by llama-quantize (next to
    the server) into the cache once (a Q4_K_M file to F32 is its weights de-quantized, as our engine loads them)."""
    if weights == "as_is":
        return source
    from utils.offline_models import cache_root

    size = source.stat().st_size
    out = cache_root() / "llama-cpp" / f"{source.stem}-{size}.{QUANT_TYPES[weights]}.gguf"
    if out.is_file():
        return out
    quantize = Path(server).with_name("llama-quantize")
    if not quantize.is_file():
        raise UserError(f"llama_cpp.weights: {weights} needs llama-quantize next to {server}; .ci/llama-cpp-env "
                        "builds both, or set llama_cpp.weights: as_is")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    done = subprocess.run([str(quantize), "--allow-requantize", str(source), str(partial), QUANT_TYPES[weights]],
                          capture_output=True, text=True, timeout=QUANTIZE_TIMEOUT_S)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise UserError(f"llama_cpp.weights: llama-quantize could not make {weights} of {source.name} ({last}); "
                        "set llama_cpp.weights: as_is")
    partial.replace(out)
    return out


def model_files(config, server: str) -> dict[str, str]:
    """role -> the GGUF the servers load: the target, and each draft a llama_cpp_* method uses."""
    weights = config.llama_cpp.weights
    files = {"target": str(quantized(gguf_of(config.target, "target"), weights, server))}
    used = {d for m in config.methods if REGISTRY[m].engine == "llama_cpp" and REGISTRY[m].needs_draft
            for d in REGISTRY[m].draft_kinds}
    for index, draft in enumerate(config.draft):
        if draft.kind in used:
            role = "draft" if len(config.draft) == 1 else f"draft[{index}]"
            files[draft.name] = str(quantized(gguf_of(draft, role), weights, server))
    return files


def check_llama_cpp(config, log: Path) -> dict:
    """Before any model loads: the binary is llama-server, the models are GGUF files (made at llama_cpp.weights), and
    a server of the target alone starts on them and answers (one that exits or hangs at its start is bad input: every
    point would fail the same way)."""
    server = server_path(config)
    with checking_worker(LlamaCppProcess, sys.executable, log, "llama_cpp.server") as worker:
        answer = worker.ask({"op": "check", "server": server}, CHECK_TIMEOUT_S)
        if not answer.get("ok"):
            raise UserError(f"llama_cpp.server: {reason(answer)}; build llama.cpp's server with "
                            "`.ci/llama-cpp-env DIR` and set llama_cpp.server: DIR/bin/llama-server")
        models = model_files(config, server)
        settings = config.llama_cpp
        probe = {"server": server, "model": models["target"], "spec_type": None, "slots": 1, "ctx": 512,
                 "threads": settings.threads, "repack": settings.repack, "start_timeout_s": settings.start_timeout_s}
        started = worker.ask({"op": "start", "engine": probe}, settings.start_timeout_s + CHECK_TIMEOUT_S)
        if not started.get("ok"):
            raise UserError(f"llama_cpp.server: {server} did not start on the target {Path(models['target']).name}: "
                            f"{reason(started)}; its log: {log}")
    return {"server": server, "llama_cpp": answer["llama_cpp"], "models": models}


def reason(answer: dict) -> str:
    """A worker's error without its exception's type (RuntimeError: what the worker raises to say what happened)."""
    return str(answer.get("error")).removeprefix("RuntimeError: ")


class LlamaCppExecutor(ProcessExecutor):
    """The llama_cpp_* points of the units it is given, each in a llama.cpp server (runner/engines/process.py)."""
    name, title, process, kept = "llama_cpp", "llama.cpp", LlamaCppProcess, ("server",)
    check = staticmethod(check_llama_cpp)

    def engine_kwargs(self, point: Point) -> dict:
        config = self.config
        prompts = self.session.prompt_set.prompts
        longest = max(len(p.token_ids) for p in prompts)
        slots = max_concurrency(config, len(prompts)) or min(max(config.batch_size), len(prompts))
        models = self.checked["models"]
        spec = REGISTRY[point.method]
        args = spec.engine_config(point, None, config.method_options.get(point.method)) or {}
        if "draft" in args:
            args["draft"] = models[args["draft"]]
        per_slot = longest + config.generation.max_new_tokens + 2 * max(config.speculative.gamma) + 16
        return {"server": self.checked["server"], "model": models["target"], "spec_type": None, **args,
                "slots": slots, "ctx": slots * per_slot, "threads": config.llama_cpp.threads,
                "repack": config.llama_cpp.repack, "start_timeout_s": config.llama_cpp.start_timeout_s}

    def engine_bytes(self, kwargs: dict) -> int | None:
        """The GGUF files it maps (the target's, and the draft's): every server maps the same files, and the page
        cache holds one copy, but each is counted, as the base counts engines."""
        return sum(Path(kwargs[key]).stat().st_size for key in ("model", "draft") if kwargs.get(key))

    def overhead_bytes(self) -> int:
        return SERVER_OVERHEAD_BYTES

    def measured(self, spec, row: dict, answer: dict | None) -> tuple[dict, dict]:
        """The client's times (timing_of: the batch's wall, or a served request's arrival to last token), the server's
        own TTFT and latency per request in extra, rounds from its counters."""
        timings = row.get("timings") or {}
        prompt_s = timings.get("prompt_ms", 0.0) / 1000
        extra = {"llama_cpp_ttft_s": prompt_s, "llama_cpp_latency_s": prompt_s + timings.get("predicted_ms", 0.0) / 1000,
                 "llama_cpp_timings": timings, "llama_cpp_ids_lost": row.get("ids_lost", 0)}
        rounds = rounds_of(row.get("counts")) if spec.has_rounds else None
        return dict(output_ids=row["output_ids"], new_tokens=row["new_tokens"], stop_reason=row["stop_reason"],
                    target_forwards=len(rounds) + 1 if rounds is not None else None, rounds=rounds), extra

    def probe_group(self, engine) -> str:
        """A 1-token completion prefills the target, and a draft model too (draft-simple runs its draft over every
        prefill batch; n-gram drafting and the target alone run nothing else), so servers with the same draft, or
        none, do the same probe work and their readings compare across blocks."""
        draft = engine.kwargs.get("draft")
        return f"servers with draft {Path(draft).name}" if draft else "servers without a draft model"

    def how_paired(self) -> str:
        what = super().how_paired()
        if self.pairing != "batch":
            what += (", its readings compared across the servers that do the same probe work (without a draft model; "
                     "with each draft), so the drift figure spans the blocks. llama.cpp b11434 takes no per-request "
                     "speculation settings, so the reference and a speculative point cannot share a server")
        return what + f"; weights {self.config.llama_cpp.weights}" + ("" if self.config.llama_cpp.repack else
                                                                       ", no weight repacking (-nr)")

    def own_info(self) -> dict:
        return {"models": self.checked["models"], "weights": self.config.llama_cpp.weights,
                "repack": self.config.llama_cpp.repack}


def rounds_of(counts: list | None) -> list[dict] | None:
    """A request's rounds from its streamed chunks' (tokens_predicted, draft_n, draft_n_accepted), cumulative.

    The first token is the prefill's. The server raises draft_n when it drafts and draft_n_accepted when it verifies,
    before it sends that step's tokens, so a chunk whose counts moved carries a token of a new verification round:
    drafted and accepted are the increases, and it emits accepted + 1 tokens (fewer where the stop cut it).
    tokens_predicted counts every token, sent or not: a token that ends inside a UTF-8 character is withheld (its
    text goes out with a later one), the prefill's among them, so a chunk may follow the one before by several tokens.
    Those withheld before a chunk whose counts moved finish the open round first (up to its accepted + 1), then
    start the new one; tokens past a round's accepted + 1 with counts that did not move are plain steps (no draft: an
    n-gram miss), one token each. None where the counts are missing or do not add up."""
    if not counts:
        return None
    rounds: list[dict] = []
    left = 0  # tokens the open verification round still emits
    before = [1, 0, 0]  # the prefill's token, whether or not its chunk was sent
    for predicted, drafted, accepted in counts:
        new = predicted - before[0]
        if new < 0 or drafted < before[1] or accepted < before[2]:
            return None
        if (drafted, accepted) != tuple(before[1:]):
            if new < 1:  # a round without a token
                return None
            finished = min(left, new - 1)  # withheld tokens that ended the open round
            if finished:
                rounds[-1]["emitted"] += finished
                new -= finished
            rounds.append({"drafted": drafted - before[1], "accepted": accepted - before[2], "emitted": 0})
            left = accepted - before[2] + 1
        for _ in range(new):
            if left > 0:
                rounds[-1]["emitted"] += 1
                left -= 1
            else:
                rounds.append({"drafted": 0, "accepted": 0, "emitted": 1})
        before = [predicted, drafted, accepted]
    if any(r["emitted"] < 1 for r in rounds):
        return None
    return rounds
