"""llama.cpp's draft-model speculation (--spec-type draft-simple) at gamma with a draft model: up to gamma drafts a
step (--spec-draft-n-max), a draft kept only when at least llama_cpp_draft_min tokens and its greedy probabilities
stay at or above llama_cpp_draft_p_min."""
from dataclasses import dataclass

from decode.methods.base import MethodSpec, option


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


def deploy(choice) -> tuple[list[str], list[str]]:
    """A draft model drafting K every round, as measured: --spec-draft-n-min K and --spec-draft-p-min 0, so that no
    draft is cut short by its confidence."""
    k = str(choice.gamma)
    model, notes = choice.model_for("gguf", "llama.cpp")
    return ["--spec-type", "draft-simple", "--model-draft", model, "--spec-draft-n-max", k, "--spec-draft-n-min",
            k, "--spec-draft-p-min", "0"], notes


def server_args(point, drafts, options: DraftOptions):
    return {"spec_type": "draft-simple", "draft": point.draft, "n_max": point.gamma,
            "n_min": options.llama_cpp_draft_min, "p_min": options.llama_cpp_draft_p_min}


RANK = 1  # its place among the engine's methods (decode/methods/__init__.py)
SPEC = MethodSpec("llama_cpp_draft", "llama.cpp's draft-model speculation: the draft proposes up to gamma tokens a "
                  "step", axes=("draft", "gamma"), run=None, has_rounds=True, per_row_timing=False, engine="llama_cpp",
                  counterpart="speculative", options=DraftOptions, engine_config=server_args, deploy=deploy)
