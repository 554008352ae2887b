"""docs/config.md from the config schema (utils/config.py): one table per section, each key's type, default and
description as the pydantic fields declare them, so the reference and the validation cannot drift apart.

    python -m utils.config_doc            # print the markdown
    python -m utils.config_doc --write    # write docs/config.md

What the schema cannot say (model specs, dataset presets, flat configs, the shipped configs) is prose in
docs/models-and-data.md; PREAMBLE and SECTIONS below hold only the example and one line per section.
"""
from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from decode.methods import ENGINE_SECTIONS
from utils.config import Config

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
COMMAND = "python -m utils.config_doc --write"

ENGINE_EXAMPLES = "".join(f"{name}: {module.EXAMPLE}\n" for name, module in ENGINE_SECTIONS.items())
PREAMBLE = f"""# Config reference

<!-- Generated from utils/config.py by `{COMMAND}`; edit the field descriptions there, not this file. -->

An experiment is one YAML file (`python launch.py --config FILE`); `--set KEY=VALUE` overrides any key by its dotted
path, the value read as YAML (`--set speculative.gamma=[2,4]`). Unknown keys are refused with a suggestion
(`config key 'generaton' is not known; did you mean 'generation'?`), so are unknown methods. Models, datasets and
their presets, flat seed-style configs and the configs shipped in `configs/`:
[models-and-data.md](models-and-data.md). Methods, schedules and trees: [methods.md](methods.md).

```yaml
name: gsm8k-qwen3                     # letters, digits, . _ - (used in the folder name)
device: cuda:0                        # cpu | cuda | cuda:N
seed: 0
target: {{model: Qwen/Qwen3-4B, dtype: bfloat16, quantization: 4bit, attn_implementation: auto}}
draft:                                # one mapping, or a list: each draft against the same baseline
  - {{model: Qwen/Qwen3-0.6B, label: q0.6b}}
  - {{model: Qwen/Qwen3-1.7B, label: q1.7b}}
dataset: {{path: openai/gsm8k, name: main, split: test, num_samples: 100, preset: gsm8k, enable_thinking: false}}
generation: {{max_new_tokens: 256, do_sample: false, temperature: 1.0, top_k: null, top_p: null}}
speculative: {{gamma: [2, 4, 8], schedule: [constant, cost_model], confidence: 0.4, exit_layer: null, ngram_max: 3, ngram_min: 1}}
batch_size: [1, 4]                    # int or list; a list is a sweep
# load: {{concurrency: [1, 4], request_rate: [2.0, inf], slo: {{ttft_s: 2.0}}}}   # a serving run, in place of batch_size
methods: [baseline, speculative, prompt_lookup, hf_generate, hf_assisted]
warmup: 1
repeats: 1                            # or auto: repeat until every speedup CI is within ci_target
max_repeats: 5
ci_target: 0.10
time_budget_s: null
engine: {{cpu_linear: auto, pack_batch_hint: 4}}
report: {{summary_file_name: null, plots: true}}
cluster: {{backend: none}}              # or {{backend: ray, address: local, num_workers: 2, num_gpus: 1, num_cpus: 4}}
{ENGINE_EXAMPLES}```

A type written `X or list of X` takes one value or a list; on a sweep axis a list sweeps (every combination of the
values a method takes is a point).
"""

# one line of prose per section: what the schema cannot say about it
SECTIONS = {
    "": "The experiment.",
    "target": "`target` is the model measured; each entry of `draft` (one mapping, or a list) is a model of the same "
              "form, one value of the `draft` axis. Keys written `*.key` apply to both.",
    "dataset": "The prompts: [models-and-data.md](models-and-data.md#datasets) describes paths and presets.",
    "generation": "How every method decodes: greedy, or sampling with the same settings for every point.",
    "speculative": "The speculation axes and their settings ([methods.md](methods.md)).",
    "load": "A serving run ([load.md](load.md)): every method serves the same requests on the same arrival trace, "
            "with continuous batching, at each load point (every pair of a concurrency and a request_rate). The trace "
            "is drawn as vLLM's `bench serve` draws it: a gap before each request, the first included, the times "
            "rescaled so that the last of N requests arrives at N / rate (conversations: N first turns, each later turn arriving load.think_s after the turn before it ends); it is seeded by the run's seed and the "
            "repeat, not by the concurrency, so every concurrency at a rate sees the same trace. TTFT and E2E are "
            "timed from the moment a request may start: its arrival or, under a concurrency cap (a closed loop "
            "too), the moment a slot frees for it, as vLLM times from passing its --max-concurrency semaphore; the "
            "wait from arrival to then is reported as queue_s.",
    "engine": "Our engine's kernels ([engine.md](engine.md), [compiled-engine.md](compiled-engine.md)).",
    "report": "The report folder ([report.md](report.md)).",
    "cluster": "Where units run ([engines.md](engines.md#sweeps-on-a-ray-cluster)).",
    **{name: module.DOC for name, module in ENGINE_SECTIONS.items()},  # each engine's own section
}


def _scalar(value: Any) -> str:
    """A value as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value).replace('"', "")
    return str(value)


def _model_of(annotation) -> type[BaseModel] | None:
    """The pydantic model a field holds (itself, as the items of a list, or beside null: an optional section such as
    load), else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next((m for m in map(_model_of, typing.get_args(annotation)) if m is not None), None)
    if typing.get_origin(annotation) is list:
        annotation = typing.get_args(annotation)[0]
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def type_name(annotation) -> str:
    """A field's type in words: `int`, `auto or int`, `one of a, b`, `list of int`, `mapping`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(f"`{_scalar(a)}`" for a in args) if len(args) > 1 else f"`{_scalar(args[0])}`"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is list:
        return "list of " + type_name(args[0])
    if origin is dict or annotation is dict or _model_of(annotation) is not None:
        return "mapping"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def constraints(metadata: list) -> str:
    """ge/gt/le/lt as `≥ 1`, `> 0`, joined; allow_inf_nan=False as `finite`."""
    words = []
    for item in metadata:
        for kind, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(item, getattr(annotated_types, kind.capitalize())):
                words.append(f"{sign} {_scalar(getattr(item, kind))}")
        if getattr(item, "allow_inf_nan", None) is False:
            words.append("finite")
    return ", ".join(words)


def default_of(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    return f"`{_scalar(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _list_in(annotation):
    """The list type a field holds (itself, or beside null), else None."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    return next((a for a in (annotation, *options) if typing.get_origin(a) is list), None)


def _one_or_list(model: type[BaseModel]) -> set[str]:
    """List fields whose validator runs before pydantic's: they take one value as a list of one."""
    validators = model.__pydantic_decorators__.field_validators.values()
    return {name for v in validators if v.info.mode == "before" for name in v.info.fields
            if _list_in(model.model_fields[name].annotation) is not None}


# a field stored in another type than the one written (trees are written as lists and mappings, stored as labels)
WRITTEN_AS = {"speculative.tree": "null, `auto`, a branching list, `{dynamic: N}`, or a list of these"}


def rows(model: type[BaseModel], prefix: str) -> tuple[list[str], list[tuple[str, str, type[BaseModel]]]]:
    """The table rows of a model's own keys, and its nested sections (name, key prefix, model)."""
    lines, nested = [], []
    single = _one_or_list(model)
    for name, field in model.model_fields.items():
        sub = _model_of(field.annotation)
        if sub is not None:
            nested.append((name, f"{prefix}{name}.", sub))
        kind = type_name(field.annotation)
        if name in single:
            listed = _list_in(field.annotation)
            kind = f"{type_name(typing.get_args(listed)[0])}, or a list" + (", or null" if listed != field.annotation
                                                                             else "")
        kind = WRITTEN_AS.get(prefix + name, kind)
        limits = constraints(field.metadata)
        kind = f"{kind} ({limits})" if limits else kind
        lines.append(f"| `{prefix}{name}` | {_cell(kind)} | {_cell(default_of(field))} | "
                     f"{_cell(field.description or '')} |")
    return lines, nested


HEADER = ["| key | type | default | meaning |", "|---|---|---|---|"]


def render() -> str:
    top, nested = rows(Config, "")
    out = [PREAMBLE, "## Top level", "", SECTIONS[""], "", *HEADER, *top, ""]
    seen: set[type[BaseModel]] = set()
    for name, prefix, model in nested:
        if model in seen:  # the draft entries are models like the target: one table for both
            continue
        seen.add(model)
        shared = [n for n, _, m in nested if m is model]
        title = ", ".join(f"`{n}`" for n in shared)
        prefix = "*." if len(shared) > 1 else prefix
        lines, deeper = rows(model, prefix)
        for inner, inner_prefix, inner_model in deeper:  # a section inside a section (load.slo): its rows follow
            more, deepest = rows(inner_model, inner_prefix)
            assert not deepest, f"{name}.{inner}: a section two deep is not rendered"
            lines += more
        out += [f"## {title}", "", SECTIONS.get(name, ""), "", *HEADER, *lines, ""]
    return "\n".join(out).replace("\n\n\n", "\n\n")


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--write"]:
        DOC.write_text(text)
        print(f"wrote {DOC}")
    elif argv[1:]:
        print(f"usage: python -m utils.config_doc [--write]", file=sys.stderr)
        return 2
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
