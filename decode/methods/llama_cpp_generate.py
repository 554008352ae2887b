"""llama.cpp serving the target alone: the reference of every llama_cpp_* point (their ratios are against this, never
against our engine's baseline). Runs in llama.cpp's server, driven by a worker process (runner/engines/llama_cpp)."""
from decode.methods.base import EngineCaps, EngineText, MethodSpec


def server_args(point, drafts, options):
    return {}


TEXT = EngineText(
    title="llama.cpp", methods="llama_cpp_*",
    no_prediction="llama.cpp's server runs draft and target inside its own slot loop, so no lone draft or verification "
                  "forward can be timed through it: c and v, and so the prediction, are not measurable there",
    no_prediction_load="llama.cpp's server runs draft and target in one slot loop: no c or v is measurable through it",
    drift_probe="1-token completion of the first prompt, at each start and end of the llama.cpp servers that do "
                "the same probe work (those without a draft model, or with the same draft)",
    # latency and TPOT on the client's clock, as tok/s (the server's generation time leaves out the stream's
    # delivery); TTFT the server's prompt time, which the client does not see apart in a fixed batch
    request_times=(None, "llama_cpp_ttft_s"),
    legend="llama.cpp as a third engine (the llama_cpp_* methods): its llama-server, started by the run on 127.0.0.1 "
           "with the GGUF files (llama_cpp.weights: as they are, or re-quantized by its llama-quantize), one server "
           "per point, as many parallel slots as the largest batch or concurrency. Each llama_cpp_* point's ratios "
           "pair it with llama_cpp_generate (the server with the target alone) on the same prompts, never with our "
           "baseline; exact_match likewise. Prompts go in as token ids (the prompt cache off: every prompt is "
           "prefilled), greedy. Rounds come from the server's own counters: each streamed token carries the "
           "request's cumulative draft_n and draft_n_accepted (timings_per_token), so a verification step is the "
           "tokens that arrived with one pair of counts (drafted and accepted: their increase; emitted: its "
           "tokens), and tokens that came with no new drafts are plain 1-token steps. A record's latency_s is the "
           "client's clock (the batch's wall time, as every method's): tok/s, latency and TPOT of a llama.cpp point "
           "are all on it; its TTFT is the server's prompt time (llama_cpp_ttft_s). The server's own generation "
           "times are kept in each record's extra (llama_cpp_latency_s, llama_cpp_timings). Null, with a note: c, v, the prediction, the prefill split and draft time")
RANK = 0  # its place among the engine's methods (decode/methods/__init__.py)
SPEC = MethodSpec("llama_cpp_generate", "llama.cpp's server, the target alone: the reference of the llama_cpp_* points",
                  axes=(), run=None, is_reference=True, per_row_timing=False, engine="llama_cpp",
                  counterpart="baseline",
                  engine_config=server_args, engine_text=TEXT, engine_caps=EngineCaps())
