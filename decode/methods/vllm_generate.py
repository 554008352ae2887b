"""vLLM serving the target alone: the reference of every vLLM point (its ratios are against this, never against
our engine's baseline). Runs in a vLLM worker process (runner/engines/vllm/engine.py), not here."""
from decode.methods.base import EngineCaps, EngineText, MethodSpec


def speculative_config(point, drafts, options):
    return None


TEXT = EngineText(
    title="vLLM", methods="vllm_*",
    no_prediction="vLLM runs draft and target inside its own scheduler step, so no lone draft or verification forward "
                  "can be timed through it: c and v, and so the prediction, are not measurable there",
    no_prediction_load="vLLM runs draft and target in one scheduler step: no c or v is measurable through it",
    drift_probe="1-token generate of the first prompt through the same vLLM engine",
    request_times=("vllm_latency_s", "vllm_ttft_s"),
    legend="vLLM as a second engine (the vllm_* methods): each vLLM point's ratios pair it with vllm_generate "
           "(vLLM serving the target alone) on the same prompts, never with our baseline; exact_match likewise. "
           "The engine comparison: vLLM's reference tok/s / our baseline's over the batches both measured (the "
           "same paired bootstrap over prompts; not back to back: in each repeat our points run, then vLLM's), "
           "whether their greedy tokens agree, and each vllm_* point beside our point of the same method, draft "
           "and gamma (constant schedule), marked as in the main table. From vLLM's own counters: the worker "
           "steps the engine and records the tokens each step gave each row (a step is one target forward: "
           "target_forwards), and vLLM's detailed per-request spec-decode counters give each verification step "
           "with drafts (drafted, accepted); the other decode steps drafted nothing (vLLM does not count them) "
           "and are 1-token rounds; a last step cut by the stop emits what its step gave. Counters that disagree "
           "with the steps give no rounds. A record's latency_s is the wall time of the batch, from submitting "
           "its requests to the last one's end (throughput and speedup use it, as every method's batch wall); "
           "the latency_s, tpot_s and ttft_s figures of a vLLM point are vLLM's own per request (arrival to "
           "first and last token, queueing included), kept in each record's extra. The prefix cache is off "
           "(every prompt is prefilled, as in our engine); on a CPU vLLM computes on every core, as ours. Null, "
           "with a note: c, v, the prediction, the prefill split, decode speedup and draft time (vLLM runs "
           "draft and target in one scheduler step: nothing times them apart)")
RANK = 0  # its place among the engine's methods (decode/methods/__init__.py)
SPEC = MethodSpec("vllm_generate", "vLLM, the target alone: the reference of the vllm_* points", axes=(), run=None,
                  is_reference=True, per_row_timing=False, engine="vllm", counterpart="baseline", engine_config=speculative_config,
                  engine_text=TEXT, engine_caps=EngineCaps())  # it times no forward apart, probes no numerics
