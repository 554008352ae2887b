"""Load a causal LM and its tokenizer from a hub id, local folder, GGUF file or offline short name."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from utils import UserError
from utils.config import ModelConfig
from utils.offline_models import OFFLINE_MODELS, resolve_offline_model


class ModelLoadError(UserError):
    pass


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: str  # what was loaded, for the report
    dtype: str
    attn_implementation: str
    quantization: str
    vocab_size: int  # output rows of the LM head (may exceed the tokenizer: padded rows)
    kernels: str = "nn.Linear"


def resolve_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device: {name} asked but CUDA is not available here (torch {torch.__version__}); "
                            "use --set device=cpu or run on a machine with a GPU")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise UserError(f"device: {name} asked but only {torch.cuda.device_count()} GPU(s) exist; use cuda:0 .. "
                            f"cuda:{torch.cuda.device_count() - 1}")
        device = torch.device("cuda", index)
    return device


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cpu":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return getattr(torch, name)


def resolve_attention(name: str, device: torch.device, dtype: torch.dtype) -> str:
    if name == "auto":
        usable = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and flash_attn_available()
        return "flash_attention_2" if usable else "sdpa"
    return name


def check_model_config(cfg: ModelConfig, role: str) -> None:
    """What can be refused before anything loads."""
    if cfg.quantization != "none" and importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(f"{role}.quantization: {cfg.quantization} needs bitsandbytes, which is not installed; "
                        "pip install bitsandbytes, or set quantization: none")
    if cfg.attn_implementation == "flash_attention_2" and not flash_attn_available():
        raise UserError(f"{role}.attn_implementation: flash_attention_2 asked but flash-attn is not installed; "
                        "pip install -r requirements-gpu.txt on a GPU machine, or use auto/sdpa")
    if cfg.model.startswith("synthetic:"):
        from utils.synthetic import parse

        try:
            parse(cfg.model)
        except ValueError as error:
            raise UserError(f"{role}.model: {error}") from None
    elif cfg.model not in OFFLINE_MODELS and _looks_local(cfg.model) and not Path(cfg.model).exists():
        raise UserError(f"{role}.model: {cfg.model} does not exist; give an existing folder or .gguf file, a hub id, "
                        f"or an offline model ({', '.join(OFFLINE_MODELS)})")


def _looks_local(model: str) -> bool:
    """A path rather than a hub id ('org/name'); existing folders load as folders whatever their shape."""
    return model.startswith((".", "/", "~")) or model.endswith(".gguf") or model.count("/") > 1


def locate(cfg: ModelConfig) -> tuple[str, str | None, str]:
    """-> (path or hub id for from_pretrained, gguf file name or None, description)."""
    if cfg.model in OFFLINE_MODELS:
        folder = resolve_offline_model(cfg.model)
        return str(folder), None, f"{cfg.model} = {OFFLINE_MODELS[cfg.model].hub_id}, offline copy {folder}"
    path = Path(cfg.model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(path.parent), path.name, str(path)
    if path.is_dir():
        return str(path), cfg.gguf_file, str(path)
    return cfg.model, cfg.gguf_file, f"hub:{cfg.model}"


def load_model(cfg: ModelConfig, device: torch.device, role: str) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    check_model_config(cfg, role)
    dtype = resolve_dtype(cfg.dtype, device)
    attention = resolve_attention(cfg.attn_implementation, device, dtype)
    if cfg.model.startswith("synthetic:"):
        return _load_synthetic(cfg, device, dtype, attention, role)
    where, gguf_file, source = locate(cfg)
    kwargs = dict(dtype=dtype, attn_implementation=attention, revision=cfg.revision)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if cfg.quantization != "none":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=cfg.quantization == "4bit", load_in_8bit=cfg.quantization == "8bit",
            bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype)
        kwargs["device_map"] = {"": device}
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=gguf_file, revision=cfg.revision)
        model = AutoModelForCausalLM.from_pretrained(where, **kwargs)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        raise ModelLoadError(_explain(role, cfg, source, error)) from None
    if cfg.quantization == "none":
        model = model.to(device)
    model.eval()
    model.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    vocab_size = model.get_output_embeddings().weight.shape[0]
    return LoadedModel(model, tokenizer, source, str(dtype).removeprefix("torch."), attention, cfg.quantization, vocab_size)


def _load_synthetic(cfg: ModelConfig, device, dtype, attention: str, role: str) -> LoadedModel:
    from utils.synthetic import build_model

    if cfg.quantization != "none":
        raise ModelLoadError(f"{role}.quantization: synthetic models are not quantized; set quantization: none")
    try:
        model, tokenizer = build_model(cfg.model, dtype, attention)
    except ValueError as error:
        raise ModelLoadError(f"{role}.model: {error}") from None
    model = model.to(device).eval().requires_grad_(False)
    tokenizer.padding_side = "left"
    vocab_size = model.get_output_embeddings().weight.shape[0]
    return LoadedModel(model, tokenizer, cfg.model, str(dtype).removeprefix("torch."), attention, "none", vocab_size)


def _explain(role: str, cfg: ModelConfig, source: str, error: Exception) -> str:
    text = " ".join(str(error).split())
    if source.startswith("hub:"):
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or "offline" in text.lower() or "connect" in text.lower() \
            or "resolve" in text.lower() or "couldn't" in text.lower() or "not a valid model identifier" in text.lower()
        if offline:
            return (f"{role}.model: cannot load '{cfg.model}' from the HuggingFace hub (unreachable or unknown here); "
                    f"use a local folder, a .gguf file, or an offline model: {', '.join(OFFLINE_MODELS)}")
    if "gguf" in text.lower() and "architecture" in text.lower():
        return f"{role}.model: transformers cannot load this GGUF architecture ({text[:200]}); convert it or use another model"
    return f"{role}.model: cannot load '{cfg.model}': {text[:300]}"
