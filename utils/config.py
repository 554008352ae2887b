"""The YAML experiment: schema, flat seed-style configs, `--set` overrides, one-line errors."""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from utils import UserError

METHODS = ("baseline", "speculative", "hf_generate", "hf_assisted")


class ConfigError(UserError):
    pass


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(Strict):
    model: str = Field(description="hub id, local folder, local .gguf file, or an offline model's short name")
    gguf_file: str | None = Field(None, description="GGUF file inside `model` (a folder or hub repo)")
    revision: str | None = None
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    quantization: Literal["none", "8bit", "4bit"] = "none"
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = "auto"


class DatasetConfig(Strict):
    path: str = Field(description="hub id, local .json/.jsonl/.parquet/.csv (optionally .gz), or pkg://package/file")
    name: str | None = None
    split: str = "test"
    preset: Literal["gsm8k", "humaneval", "mt_bench", "none"] = "none"
    prompt_field: str | None = None
    num_samples: int | None = Field(None, ge=1)
    chat_template: Literal["auto", True, False] = "auto"
    system_prompt: str | None = None
    max_prompt_tokens: int | None = Field(None, ge=1)
    prompt_overflow: Literal["truncate", "skip"] = "truncate"

    @model_validator(mode="after")
    def _field_for_no_preset(self):
        if self.preset == "none" and not self.prompt_field:
            raise ValueError("preset none needs prompt_field (the column holding the prompt)")
        return self


class GenerationConfig(Strict):
    max_new_tokens: int = Field(128, ge=1)
    do_sample: bool = False
    temperature: float = Field(1.0, gt=0)
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0, le=1)


def _sweep(value, key: str) -> list[int]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError(f"{key} list is empty; give at least one value")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{key} must be an integer or a list of integers, got {v!r}")
        if v < 1:
            raise ValueError(f"{key} must be >= 1, got {v}")
    if len(set(values)) != len(values):
        raise ValueError(f"{key} list {values} repeats a value; list each once")
    return values


class SpeculativeConfig(Strict):
    gamma: list[int] = Field([4], description="draft tokens per round; a list is a sweep")

    @field_validator("gamma", mode="before")
    @classmethod
    def _gamma(cls, value):
        return _sweep(value, "gamma")


class EngineConfig(Strict):
    cpu_linear: Literal["auto", "default", "onednn_packed"] = Field(
        "auto", description="auto: oneDNN prepacked linears on a CPU in float32 without quantization; default: nn.Linear")
    pack_batch_hint: int = Field(4, ge=1, le=64)


class ReportConfig(Strict):
    summary_file_name: str | None = Field(None, description="an extra copy of summary.json under this name")
    plots: bool = True


class Config(Strict):
    name: str = "experiment"
    device: str = "cpu"
    seed: int = 0
    target: ModelConfig
    draft: ModelConfig
    dataset: DatasetConfig
    generation: GenerationConfig = GenerationConfig()
    speculative: SpeculativeConfig = SpeculativeConfig()
    batch_size: list[int] = [1]
    methods: list[Literal["baseline", "speculative", "hf_generate", "hf_assisted"]] = ["baseline", "speculative"]
    warmup: int = Field(1, ge=0)
    repeats: int = Field(1, ge=1)
    engine: EngineConfig = EngineConfig()
    report: ReportConfig = ReportConfig()

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch(cls, value):
        return _sweep(value, "batch_size")

    @field_validator("device")
    @classmethod
    def _device(cls, value):
        if not re.fullmatch(r"cpu|cuda(:\d+)?", value):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {value!r}")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value):
        if not re.fullmatch(r"[A-Za-z0-9._-]+", value):
            raise ValueError(f"name {value!r} is used in a folder name: use letters, digits, '.', '_' or '-'")
        return value

    @field_validator("methods")
    @classmethod
    def _methods(cls, value):
        if not value:
            raise ValueError("methods is empty; list at least one of " + ", ".join(METHODS))
        if len(set(value)) != len(value):
            raise ValueError(f"methods {value} repeats a method; list each once")
        return value


# ---- seed-style flat configs -------------------------------------------------------------------

FLAT_KEYS = {"draft_model", "target_model", "k", "max_new_tokens", "max_length", "num_samples", "dataset",
             "batch_size", "device", "quantized", "summary_file_name", "name", "seed", "temperature", "do_sample"}


def is_flat(raw: dict) -> bool:
    return "draft_model" in raw or "target_model" in raw


def from_flat(raw: dict) -> dict:
    """Map a seed-style flat config onto the schema (README: 'Seed-style configs')."""
    unknown = set(raw) - FLAT_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"config key '{key}' is not a flat-style key{_did_you_mean(key, FLAT_KEYS)}")
    quantized = raw.get("quantized", False)
    quantization = {True: "4bit", False: "none", None: "none", "4bit": "4bit", "8bit": "8bit", "none": "none"}.get(quantized)
    if quantization is None:
        raise ConfigError(f"quantized: {quantized!r} is not valid; use true (4-bit), false, '4bit' or '8bit'")
    dataset = raw.get("dataset") or {}
    if isinstance(dataset, str):
        dataset = {"path": dataset}
    if not isinstance(dataset, dict):
        raise ConfigError("dataset must be a mapping like {path: openai/gsm8k, name: main}")
    dataset = dict(dataset)
    path = str(dataset.get("path", ""))
    preset = next((p for key, p in [("gsm8k", "gsm8k"), ("humaneval", "humaneval"), ("human_eval", "humaneval"),
                                    ("mt_bench", "mt_bench"), ("mt-bench", "mt_bench")] if key in path.lower()), None)
    if preset and "preset" not in dataset:
        dataset["preset"] = preset
    if "num_samples" in raw:
        dataset["num_samples"] = raw["num_samples"]
    generation = {k: raw[k] for k in ("max_new_tokens", "temperature", "do_sample") if k in raw}
    if "max_length" in raw:
        max_length, new = raw["max_length"], raw.get("max_new_tokens", GenerationConfig().max_new_tokens)
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length <= new:
            raise ConfigError(f"max_length: {max_length!r} must be an integer above max_new_tokens ({new}); "
                              "it caps prompt + new tokens")
        dataset["max_prompt_tokens"] = max_length - new
    out: dict[str, Any] = {
        "target": {"model": raw.get("target_model"), "quantization": quantization},
        "draft": {"model": raw.get("draft_model"), "quantization": quantization},
        "dataset": dataset, "generation": generation,
    }
    for key in ("name", "seed", "device", "batch_size"):
        if key in raw:
            out[key] = raw[key]
    if "k" in raw:
        out["speculative"] = {"gamma": raw["k"]}
    if "summary_file_name" in raw:
        out["report"] = {"summary_file_name": raw["summary_file_name"]}
    return out


# ---- loading and overrides ---------------------------------------------------------------------

def _did_you_mean(key: str, options) -> str:
    close = difflib.get_close_matches(key, list(options), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(sorted(options))}"


def apply_override(raw: dict, assignment: str) -> None:
    """`a.b.c=value` with value parsed as YAML (`--set speculative.gamma=[2,4]`)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set speculative.gamma=[2,4]")
    path, text = assignment.split("=", 1)
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"--set {path}: value {text!r} is not valid YAML") from None
    keys = path.strip().split(".")
    if not all(keys):
        raise ConfigError(f"--set {path!r}: empty key in the dotted path")
    node = raw
    for depth, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {path}: '{'.'.join(keys[:depth + 1])}' is not a mapping, cannot set a key inside it")
        node = child
    node[keys[-1]] = value


def _location(error: dict) -> str:
    return ".".join(str(p) for p in error["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))


def _model_at(path: list[str]):
    model: Any = Config
    for key in path:
        field = model.model_fields.get(key) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        model = field.annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def validate(raw: Any) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"config must be a YAML mapping of keys, got {type(raw).__name__}; see configs/default.yaml")
    if is_flat(raw):
        raw = from_flat(raw)
    try:
        return Config.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = _location(first)
        if first["type"] == "extra_forbidden":
            parent = _model_at([str(p) for p in first["loc"][:-1]])
            options = parent.model_fields if parent else {}
            raise ConfigError(f"config key '{where}' is not known{_did_you_mean(str(first['loc'][-1]), options)}") from None
        if first["type"] == "missing":
            raise ConfigError(f"config key '{where}' is required; see the config reference in README.md") from None
        message = first["msg"].removeprefix("Value error, ")
        got = first.get("input")
        shown = "" if isinstance(got, (dict, list)) and first["type"] != "value_error" else f" (got {got!r})"
        raise ConfigError(f"config key '{where}': {message}{shown if first['type'] != 'value_error' else ''}") from None


def load_config(path: str | Path, overrides: list[str] = ()) -> tuple[Config, dict]:
    """Returns the validated config and the resolved raw mapping (saved as config.yaml)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass --config configs/default.yaml or another file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: {getattr(error, 'problem', error)}") from None
    if raw is None:
        raise ConfigError(f"config file {path} is empty; see configs/default.yaml")
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping of keys, got a {type(raw).__name__}")
    if is_flat(raw):
        raw = from_flat(raw)
    for assignment in overrides:
        apply_override(raw, assignment)
    config = validate(raw)
    return config, config.model_dump(mode="json")
