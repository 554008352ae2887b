"""vLLM as a second engine, declared: its methods (vllm_*), what it can do, what the report says of it, its config
section (settings.py) and its deploy target (deploy.py). Torch-free and importing only decode/methods:
decode/methods/__init__.py loads it by its path, so that the registry, eval and utils know the engine without
importing runner/ (tests/test_import_graph.py). The engine itself (its worker processes) is this package's engine.py.

Every method runs in a vLLM worker process (runner/engines/vllm/engine.py), not here; engine_config gives a point's
speculative_config (None: the target alone).
"""
from decode.methods.base import EngineCaps, EngineText, MethodSpec
from decode.methods.prompt_lookup import Ngrams

SETTINGS = "settings.py"  # the config section vllm: (pydantic, loaded when the config asks for it)
DEPLOY = "deploy.py"  # the recommendation as its --speculative-config (eval/deploy loads it)

# vLLM serving the target alone: the reference of every vLLM point (its ratios are against this, never against our
# engine's baseline)
def target_alone(point, drafts, options):
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
GENERATE = MethodSpec("vllm_generate", "vLLM, the target alone: the reference of the vllm_* points", axes=(), run=None,
                      is_reference=True, per_row_timing=False, engine="vllm", counterpart="baseline",
                      engine_config=target_alone, engine_text=TEXT,
                      engine_caps=EngineCaps())  # it times no forward apart, probes no numerics


# vLLM's draft-model speculation (speculative_config method draft_model) at gamma with a draft model.
def draft_model(point, drafts, options):
    return {"method": "draft_model", "model": drafts[point.draft].vllm_model, "num_speculative_tokens": point.gamma}


DRAFT = MethodSpec("vllm_draft", "vLLM's draft-model speculation: the draft proposes gamma tokens a step",
                   axes=("draft", "gamma"), run=None, has_rounds=True, per_row_timing=False, engine="vllm",
                   counterpart="speculative", engine_config=draft_model)


# vLLM's n-gram speculation (prompt lookup) at gamma, with this config's n-gram sizes.
def ngram(point, drafts, options: Ngrams):
    return {"method": "ngram", "num_speculative_tokens": point.gamma,
            "prompt_lookup_min": options.ngram_min, "prompt_lookup_max": options.ngram_max}


NGRAM = MethodSpec("vllm_ngram", "vLLM's n-gram speculation (prompt lookup, speculative.ngram_min..ngram_max)",
                   axes=("gamma",), run=None, has_rounds=True, per_row_timing=False, engine="vllm",
                   counterpart="prompt_lookup", options=Ngrams, engine_config=ngram)


# vLLM's EAGLE / EAGLE-3 speculation with a head for the target: a draft entry of kind eagle or eagle3
# (draft: {model: <the head's folder or hub id>, kind: eagle3}). Nothing here drafts with heads: vLLM only.
def eagle(point, drafts, options):
    draft = drafts[point.draft]
    return {"method": draft.kind, "model": draft.vllm_model, "num_speculative_tokens": point.gamma}


EAGLE = MethodSpec("vllm_eagle", "vLLM's EAGLE / EAGLE-3 speculation with a head trained for the target (a draft of "
                   "kind eagle or eagle3)", axes=("draft", "gamma"), run=None, has_rounds=True, per_row_timing=False,
                   engine="vllm", counterpart="eagle3", draft_kinds=("eagle", "eagle3"), engine_config=eagle)


# vLLM's multi-token-prediction speculation: the target's own MTP layers draft (DeepSeek-V3, Qwen3-Next, MiMo,
# GLM-4.5 and others that ship them). A target without MTP layers fails its points with vLLM's message.
def mtp(point, drafts, options):
    return {"method": "mtp", "num_speculative_tokens": point.gamma}


MTP = MethodSpec("vllm_mtp", "vLLM's MTP speculation with the target's own multi-token-prediction layers",
                 axes=("gamma",), run=None, has_rounds=True, per_row_timing=False, engine="vllm",
                 engine_config=mtp)


# vLLM's suffix decoding (Arctic Inference's suffix trees over the prompt and earlier outputs) at gamma. Needs
# the arctic-inference package in the vLLM environment; the run refuses to start without it.
def suffix(point, drafts, options):
    return {"method": "suffix", "num_speculative_tokens": point.gamma}


SUFFIX = MethodSpec("vllm_suffix", "vLLM's suffix decoding (needs arctic-inference in the vLLM environment)",
                    axes=("gamma",), run=None, has_rounds=True, per_row_timing=False, engine="vllm",
                    counterpart="suffix", engine_config=suffix, engine_package="arctic_inference")

METHODS = [GENERATE, DRAFT, NGRAM, EAGLE, MTP, SUFFIX]  # in the order the report lists them
