"""llama.cpp as a third engine, declared: its methods (llama_cpp_*), what it can do, what the report says of it, its
config section (settings.py), the flags that deploy each method (MethodSpec.deploy, which its deploy target,
deploy.py, emits). Torch-free and importing only decode/methods: decode/methods/__init__.py loads it by its path, so that the
registry, eval and utils know the engine without importing runner/ (tests/test_import_graph.py). The engine itself
(a worker process per llama-server) is this package's engine.py.

Every method runs in llama.cpp's server, driven by a worker process; engine_config gives a point's server arguments.
"""
from dataclasses import dataclass

from decode.methods import prompt_lookup
from decode.methods.base import EngineCaps, EngineText, MethodSpec, option

SETTINGS = "settings.py"  # the config section llama_cpp: (pydantic, loaded when the config asks for it)
DEPLOY = "deploy.py"  # the recommendation as llama-server's flags, acceptance as its synthetic rates (eval/deploy)

# llama.cpp serving the target alone: the reference of every llama_cpp_* point (their ratios are against this, never
# against our engine's baseline). Runs in llama.cpp's server, driven by a worker process (runner/engines/llama_cpp).
def target_alone(point, drafts, options):
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
           "times are kept in each record's extra (llama_cpp_latency_s, llama_cpp_timings). Null, with a note: c, v, "
           "the prediction, the prefill split and draft time")
GENERATE = MethodSpec("llama_cpp_generate",
                      "llama.cpp's server, the target alone: the reference of the llama_cpp_* points",
                      axes=(), run=None, is_reference=True, per_row_timing=False, engine="llama_cpp",
                      counterpart="baseline", engine_config=target_alone, engine_text=TEXT, engine_caps=EngineCaps())


# llama.cpp's draft-model speculation (--spec-type draft-simple) at gamma with a draft model: up to gamma drafts a
# step (--spec-draft-n-max), a draft kept only when at least llama_cpp_draft_min tokens and its greedy probabilities
# stay at or above llama_cpp_draft_p_min.
@dataclass(frozen=True)
class DraftOptions:
    llama_cpp_draft_min: int = option(0, "llama_cpp_draft: --spec-draft-n-min, the fewest drafts a step verifies "
                                         "(a shorter draft is dropped)", ge=0)
    llama_cpp_draft_p_min: float = option(0.0, "llama_cpp_draft: --spec-draft-p-min, drafting stops where the "
                                               "draft's top probability falls below it (0: never; llama.cpp's own "
                                               "default is 0.75)", ge=0.0, le=1.0)

    def check_config(self, config) -> None:
        """A minimum above a gamma of the run is refused (ValueError: the config's one line): llama.cpp would drop
        every draft shorter than it, and at that gamma every draft is."""
        if "llama_cpp_draft" not in config.methods:
            return
        too_short = [g for g in config.speculative.gamma if g < self.llama_cpp_draft_min]
        if too_short:
            raise ValueError(f"speculative.llama_cpp_draft_min: {self.llama_cpp_draft_min} is above gamma "
                             f"{too_short[0]}; llama.cpp drops a draft shorter than --spec-draft-n-min, so at gamma "
                             f"{too_short[0]} it would never speculate: set llama_cpp_draft_min to at most "
                             f"{min(config.speculative.gamma)}, or drop the smaller gammas")


def deploy_draft(choice) -> tuple[list[str], list[str]]:
    """A draft model drafting K every round, as measured: --spec-draft-n-min K and --spec-draft-p-min 0, so that no
    draft is cut short by its confidence."""
    k = str(choice.gamma)
    model, notes = choice.model_for("gguf", "llama.cpp")
    return ["--spec-type", "draft-simple", "--model-draft", model, "--spec-draft-n-max", k, "--spec-draft-n-min",
            k, "--spec-draft-p-min", "0"], notes


def draft_args(point, drafts, options: DraftOptions):
    return {"spec_type": "draft-simple", "draft": point.draft, "n_max": point.gamma,
            "n_min": options.llama_cpp_draft_min, "p_min": options.llama_cpp_draft_p_min}


DRAFT = MethodSpec("llama_cpp_draft", "llama.cpp's draft-model speculation: the draft proposes up to gamma tokens a "
                   "step", axes=("draft", "gamma"), run=None, has_rounds=True, per_row_timing=False, engine="llama_cpp",
                   counterpart="speculative", options=DraftOptions, engine_config=draft_args, deploy=deploy_draft)


# llama.cpp's model-free n-gram drafting (--spec-type ngram-simple): where the last llama_cpp_ngram_n tokens occurred
# before in the context, the gamma tokens that followed them are the draft (--spec-ngram-simple-size-m).
@dataclass(frozen=True)
class NgramOptions:
    llama_cpp_ngram_n: int = option(3, "llama_cpp_ngram: --spec-ngram-simple-size-n, the n-gram looked up (one "
                                       "size: prompt_lookup tries ngram_max down to ngram_min)", ge=1, le=1024)


def deploy_ngram(choice) -> tuple[list[str], list[str]]:
    """Prompt lookup as ngram-simple, its closest: a lookup n-gram of ngram_max tokens, a draft of K."""
    ngram_max = prompt_lookup.SPEC.typed_options(choice.options).ngram_max
    return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(ngram_max), "--spec-ngram-simple-size-m",
            str(choice.gamma)], []


def ngram_args(point, drafts, options: NgramOptions):
    return {"spec_type": "ngram-simple", "n_max": point.gamma, "ngram_n": options.llama_cpp_ngram_n}


NGRAM = MethodSpec("llama_cpp_ngram", "llama.cpp's n-gram drafting (ngram-simple): the tokens that followed the last "
                   "n-gram's earlier match, up to gamma a step", axes=("gamma",), run=None, has_rounds=True,
                   per_row_timing=False, engine="llama_cpp", counterpart="prompt_lookup", options=NgramOptions,
                   engine_config=ngram_args, deploy=deploy_ngram)

METHODS = [GENERATE, DRAFT, NGRAM]  # in the order the report lists them
