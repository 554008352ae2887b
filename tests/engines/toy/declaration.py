"""A toy engine in its own process, declared: it counts on from each prompt's last token, one or two tokens a step."""
from decode.methods.base import EngineCaps, EngineText, MethodSpec

SETTINGS = "settings.py"


def one_a_step(point, drafts, options):
    return {"per_step": 1}


def two_a_step(point, drafts, options):
    return {"per_step": 2}


TEXT = EngineText(title="toy", methods="toy_*", no_prediction="the toy times no forward apart",
                  no_prediction_load="the toy times no forward apart", drift_probe="the toy's 1-token count",
                  legend="a toy engine: counts on from the prompt's last token")
METHODS = [
    MethodSpec("toy_generate", "the toy, one token a step: the reference of the toy_* points", axes=(), run=None,
               is_reference=True, per_row_timing=False, engine="toy", engine_config=one_a_step, engine_text=TEXT,
               engine_caps=EngineCaps()),
    MethodSpec("toy_pairs", "the toy, two tokens a step: a round of 2 drafts, 1 accepted", axes=("gamma",), run=None,
               has_rounds=True, per_row_timing=False, engine="toy", engine_config=two_a_step),
]
