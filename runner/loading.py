"""What a process loads before it measures anything: the models of our engine (their kernels, attention, tree support
and, with engine.compile, their compiled steps), the EOS set, and the notes the report gives about them. The Session
(runner/session.py) holds what these return; nothing here runs a method.

A model goes by its role: "target", or "draft <label>" for a draft (`roles` is the one place that lists them).
"""
from __future__ import annotations

import contextlib

import torch

from decode import Clock, check_vocab_compatible
from decode.drafters.head_drafters import is_head
from decode.head_models import KINDS as HEAD_KINDS
from decode.methods import REGISTRY, caps_of
from decode.vocab import VocabMismatch
from utils import ConfigError, UserError
from utils.data import context_note
from utils.models import LoadedModel, check_exit_layers, load_model, model_devices, release_file_mappings


def roles(target: LoadedModel | None, drafts: dict[str, LoadedModel],
          models_only: bool = False) -> list[tuple[str, str | None, LoadedModel]]:
    """(role, draft label or None for the target, the model) of every loaded model, the target first. models_only:
    the causal LMs alone, without the heads (decode/head_models.py), which run only inside their drafter."""
    if target is None:
        return []
    return [("target", None, target)] + [(f"draft {label}", label, d) for label, d in drafts.items()
                                         if not (models_only and is_head(d.model))]


def eos_set(tokenizer, model_eos) -> tuple[int, ...]:
    """The ids that end a row: the model's generation config's eos (an id or a list) and the tokenizer's."""
    eos = set(model_eos if isinstance(model_eos, (list, tuple)) else [model_eos] if model_eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return tuple(sorted(eos))


def apply_engine(config, loaded) -> str:
    """Swap in the CPU linear kernels the config asks for; returns the kernels the model runs, for the notes (a
    quantized model's as loading put them in)."""
    from utils.cpu_linear import pack_linears, usable

    if config.engine.compile:  # inductor compiles nn.Linear; it cannot lower oneDNN's packed weights
        return f"{loaded.kernels}, compiled"
    if config.engine.cpu_linear == "default" or loaded.quantization != "none" or not usable(loaded.model):
        return loaded.kernels
    count = pack_linears(loaded.model, config.engine.pack_batch_hint)
    return f"oneDNN prepacked linear x{count} (batch hint {config.engine.pack_batch_hint})"


def status_of(status):
    """what -> a context manager that shows "loading <what>" (rich's status), or does nothing."""
    return (lambda what: status(f"loading {what}")) if status else (lambda what: contextlib.nullcontext())


def load_models(config, device: torch.device, loading) -> tuple[LoadedModel, dict[str, LoadedModel], Clock]:
    """The target and the drafts our engine's methods use (a draft only another engine uses is not loaded: it loads
    its own), checked against each other, with their kernels, and a clock that synchronises every device they use."""
    with loading("target model"):
        target = load_model(config.target, device, "target")
    check_exit_layers(config, target.model.config)  # a depth not readable before loading
    drafts = {}
    for index, draft_config in enumerate(config.draft):
        role = "draft" if len(config.draft) == 1 else f"draft[{index}]"
        if not any(REGISTRY[m].needs_draft and caps_of(m).home and draft_config.kind in
                   REGISTRY[m].draft_kinds for m in config.methods):
            continue
        if draft_config.kind in HEAD_KINDS:
            with loading(f"draft head {draft_config.name}"):
                drafts[draft_config.name] = load_draft_head(draft_config, target, role)
            continue
        with loading(f"draft model {draft_config.name}"):
            draft = load_model(draft_config, device, role)
        try:
            check_vocab_compatible(target.tokenizer, draft.tokenizer, target.vocab_size, draft.vocab_size)
        except VocabMismatch as error:
            raise UserError(f"{role}.model: {error}") from None
        drafts[draft_config.name] = draft
    for _, _, loaded in roles(target, drafts):
        if is_head(loaded.model):
            continue
        loaded.kernels = apply_engine(config, loaded)
        release_file_mappings(loaded.model)  # weights in memory of their own: the mmap'd files close
    devices = {d for _, _, loaded in roles(target, drafts) for d in model_devices(loaded.model)}
    others = tuple(sorted((d for d in devices if d.type == "cuda" and d != device), key=str))
    # a model split over several GPUs: every clock read synchronises all of them
    return target, drafts, Clock(device, extra_devices=others) if others else Clock(device)


def load_draft_head(draft_config, target: LoadedModel, role: str) -> LoadedModel:
    """A head for the target (decode/head_models.py: kind eagle3 or medusa) from a local folder, or synthetic:head (the
    target's shape, random weights: its cost with no folder), in the target's dtype (or the draft's own where set) on
    the target's device, checked against the target; UserError: one line."""
    from pathlib import Path

    from decode.head_models import HeadFormatError, load_head, synthetic_head

    dtype = target.model.dtype if draft_config.dtype == "auto" else getattr(torch, draft_config.dtype)
    source = draft_config.model
    try:
        if source.startswith("synthetic:"):
            head = synthetic_head(source, draft_config.kind, target.model, dtype)
        else:
            folder = Path(source).expanduser()
            if not folder.is_dir():
                raise UserError(f"{role}.model: {source} is not a folder; a {draft_config.kind} head is loaded from a "
                                "local folder with its config.json and weights, or is synthetic:head")
            head, source = load_head(folder, draft_config.kind, target.model, dtype), str(folder)
    except HeadFormatError as error:
        raise UserError(f"{role}.model: {error}") from None
    return LoadedModel(model=head, tokenizer=target.tokenizer, source=source, dtype=str(dtype).removeprefix("torch."),
                       attn_implementation="sdpa", quantization="none", vocab_size=target.vocab_size, kernels="nn.Linear")


def config_attention(config, role: str) -> str:
    """The attn_implementation the config asked for a role ("target", "draft <label>")."""
    if role == "target":
        return config.target.attn_implementation
    label = role.split(" ", 1)[1]
    return next(d.attn_implementation for d in config.draft if d.name == label)


def give_way_to_sdpa(config, role: str, loaded: LoadedModel) -> None:
    """flash-attn 2 that attn_implementation auto picked takes no prebuilt mask: a tree or the compiled mode runs sdpa."""
    if loaded.attn_implementation == "flash_attention_2" and config_attention(config, role) == "auto":
        loaded.model.set_attn_implementation("sdpa")
        loaded.attn_implementation = "sdpa"


def check_trees(config, target, drafts) -> None:
    """speculative.tree: the models must take a tree mask (decode/kv.py tree_support_problem)."""
    from decode.kv import tree_support_problem

    if all(label is None for label in getattr(config.speculative, "tree", [None])):
        return
    for role, _, loaded in roles(target, drafts, models_only=True):
        give_way_to_sdpa(config, role, loaded)
        problem = tree_support_problem(loaded.model)
        if problem:
            raise UserError(f"{role} {loaded.source}: {problem}")


def refuse_ragged_batches_if_wrong(config, target, drafts) -> None:
    """A model whose position bias follows cache slots (ALiBi from slot indices) decodes a left-padded row wrongly,
    silently: probe it once at load, and refuse batches of several prompts for it (a serving run's too)."""
    if max(config.batch_size) == 1 and (config.load is None or max(c for c, _ in config.load.points(2)) == 1):
        return
    from decode.numerics import ragged_batch_problem

    for role, _, loaded in roles(target, drafts, models_only=True):
        with torch.inference_mode():
            problem = ragged_batch_problem(loaded.model)
        if problem:
            raise UserError(f"{'load' if config.load else 'batch_size'}: {role} {loaded.source}: {problem}")


def compile_models(config, target, drafts, points, longest_prompt: int) -> str:
    """engine.compile: each model gets static buffers sized for this run and a compiled step per width it uses
    (decode/compile_plan.py compile_widths: the target 1, gamma + 1 and its trees' n + 1; a draft 1 and 2 and its
    tree forwards). Returns the note that says so."""
    from decode.compile_plan import compile_widths
    from decode.static_kv import CompiledModel, CompileRefused, attach
    from runner.probes import AUTO_TREE_NODES

    plan = compile_widths(points, config.speculative.tree_top_k, AUTO_TREE_NODES)
    # a row holds its prompt and its new tokens, plus one round's columns beyond them; the cost_model schedule's
    # draft prefill probe feeds the prompt twice (runner/probes.py draft_prefill_cost). Rounded up to 64
    needed = longest_prompt + config.generation.max_new_tokens + plan["round"] + 1
    if any(p.schedule in REGISTRY[p.method].measured_schedules for p in points):
        needed = max(needed, 2 * longest_prompt)
    max_length = -(-needed // 64) * 64
    mode = None if config.engine.compile_mode == "auto" else config.engine.compile_mode
    if config.engine.compile == "cudagraphs":  # decode/static_kv.py CAPTURED: no torch.compile, compile_mode unread
        mode = "cudagraphs"
    # the target's hidden states its heads read (decode/hidden.py): its graphs return them beside the logits
    head_layers = tuple(sorted({i for d in drafts.values() for i in getattr(d.model, "target_layers", None) or ()}))
    for role, label, loaded in roles(target, drafts, models_only=True):
        if loaded.attn_implementation == "flash_attention_2":  # auto picked it; the compiled mode builds masks
            loaded.model.set_attn_implementation("sdpa")
            loaded.attn_implementation = "sdpa"
        steps, trees = plan["target"] if label is None else plan["drafts"].get(label, ((1,), ()))
        try:
            compiled = CompiledModel(loaded.model, steps, max_length, compiled_batch_sizes(config), mode,
                                     config.engine.compile_backend, trees, head_layers=head_layers if label is None else (),
                                     scope=config.engine.compile_scope)
        except CompileRefused as error:
            raise UserError(f"{role} {loaded.source}: {error}") from None
        compiled.overlap = config.engine.overlap  # the loop reads it (decode/generate.py _Loop)
        attach(loaded.model, compiled)
    widths = "; ".join(f"{role} {list(model.step_widths)}"
                       + (f", trees {list(model.tree_widths)}" if model.tree_widths else "")
                       for role, model in compiled_models(config, target, drafts).items())
    how = ("captured with torch.cuda.graph, no torch.compile" if compiled.captured
           else f"torch.compile, backend {config.engine.compile_backend}, mode {compiled.mode}"
           + (", one decoder layer compiled for every layer" if compiled.scope == "regional" else ""))
    return (f"engine.compile: static KV caches of {max_length} columns, a graph per step width ({widths}) and "
            f"batch size ({how}), compiled "
            "in each comparison's probes and warmup; a step of fewer tokens runs padded to the next width; overlap "
            + ("on: a fused round is launched before its predecessor is read" if config.engine.overlap else "off"))


def compiled_batch_sizes(config) -> tuple[int, ...]:
    """The batch sizes the compiled steps are built for: a fixed batch's sizes; under a load, row buckets 1, 2, 4, ..
    up to the most rows in flight (the largest concurrency, else the requests), as the serving engines capture batch
    sizes: requests join and leave between rounds in a bucket padded with idle rows (StaticKVState.join)."""
    if config.load is None:
        return tuple(config.batch_size)
    most = max(config.load.concurrency or [config.load.requests or config.dataset.num_samples or 1024])
    buckets = [1]
    while buckets[-1] < min(most, 1024):
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


def compiled_models(config, target, drafts) -> dict:
    """role -> the CompiledModel of each loaded model (engine.compile), early exit's views of the target included."""
    from decode.static_kv import compiled_of

    if not config.engine.compile or target is None:
        return {}
    found = {label or role: compiled_of(m.model) for role, label, m in roles(target, drafts, models_only=True)}
    compiled = {role: model for role, model in found.items() if model is not None}
    for role, model in list(compiled.items()):
        for index, view in enumerate(model.views):
            compiled[f"{role} view {index}"] = view
    return compiled


def model_notes(config, target, drafts, prompt_set) -> list[str]:
    """What the report says about the loaded models and the prompts."""
    loaded = [(role, m) for role, _, m in roles(target, drafts)]
    notes = [f"{role}: {m.source} ({m.dtype}, {m.attn_implementation}, quantization {m.quantization}, {m.kernels})"
             for role, m in loaded]
    notes += [f"{role}: attention {m.attention_note}" for role, m in loaded if m.attention_note]
    notes += prompt_notes(prompt_set, config.dataset)
    if any(not REGISTRY[m].per_row_timing and caps_of(m).home for m in config.methods):
        notes.append("transformers' peers (hf_*): one wall time per batch (per-row latency = batch time), "
                     "no TTFT or forward counts")
    notes += [f"{m}: {REGISTRY[m].memory}" for m in config.methods if REGISTRY[m].memory]
    for m in config.methods:
        cap = REGISTRY[m].draft_cap and getattr(config.speculative, REGISTRY[m].draft_cap)
        if cap:
            notes.append(f"{m}: a round drafts up to max(gamma, {cap}) tokens (speculative.{REGISTRY[m].draft_cap}), "
                         "each row's length chosen by expected tokens per cost")
    return notes


def prompt_notes(prompt_set, dataset=None) -> list[str]:
    notes = []
    if prompt_set.guessed_field:
        notes.append(f"dataset: no prompt_field given; the prompts are the '{prompt_set.field_name}' column "
                     f"(the one common prompt name among the fields {', '.join(prompt_set.fields)})")
    notes.extend(prompt_set.notes)
    over = context_note(prompt_set, dataset) if dataset is not None else None
    return notes + ([over] if over else [])


def prompt_room(config, target: LoadedModel) -> int | None:
    """The most prompt tokens the target's positions leave room for: its max_position_embeddings less
    generation.max_new_tokens (utils/data.py load_prompts truncates or drops a longer prompt of any turn); None where
    its config names no such length. Refused where it leaves none."""
    model_config = getattr(target.model, "config", None)
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    positions = getattr(text, "max_position_embeddings", None)
    if not isinstance(positions, int) or isinstance(positions, bool):
        return None
    new = config.generation.max_new_tokens
    if new >= positions:
        raise ConfigError(f"generation.max_new_tokens: {new} leaves no room for a prompt in the target's context of "
                          f"{positions} positions (its max_position_embeddings); set it below {positions}")
    return positions - new
