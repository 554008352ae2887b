"""Load a causal LM and its tokenizer from a hub id, local folder, GGUF file or offline short name."""
from __future__ import annotations

import importlib.util
import warnings
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from utils import ConfigError, UserError
from utils.offline_models import OFFLINE_MODELS, cache_root, resolve_offline_model

if TYPE_CHECKING:
    from utils.config import ModelConfig


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
    # attn_implementation auto with a choice (CUDA, flash-attn 2 usable): the implementations runner/attention.py
    # times at load, the one loaded first; () when there is nothing to choose
    attention_candidates: tuple[str, ...] = ()
    attention_note: str = ""  # how auto resolved and why, for the report's notes ("" when not auto)


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


_FLASH_ATTN: dict[str, str | None] = {}  # cached: None = importable, else why not


def flash_attn_problem() -> str | None:
    """Why flash-attn 2 cannot be used here, or None. Installed is not enough: a wheel built for another
    torch or CUDA fails at import (an undefined symbol), so try the import itself, once."""
    if "result" not in _FLASH_ATTN:
        if importlib.util.find_spec("flash_attn") is None:
            _FLASH_ATTN["result"] = "flash-attn is not installed"
        else:
            try:
                import flash_attn  # noqa: F401
                _FLASH_ATTN["result"] = None
            except (ImportError, OSError, RuntimeError) as error:
                _FLASH_ATTN["result"] = f"flash-attn is installed but does not import ({' '.join(str(error).split())[:160]})"
    return _FLASH_ATTN["result"]


def flash_attn_available() -> bool:
    return flash_attn_problem() is None


def compute_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def native_bf16(device: torch.device) -> bool:
    """bf16 in hardware (Ampere, compute capability 8.0, and later). Older GPUs report bf16 as supported
    through emulation, which is slow: a benchmark must not pick it by itself."""
    return device.type == "cuda" and compute_capability(device) >= (8, 0)


def resolve_dtype(name: str, device: torch.device, quantization: str = "none") -> torch.dtype:
    if name == "auto":
        if quantization == "torchao-int4":  # its int4 matmul takes bfloat16 activations alone
            return torch.bfloat16
        if device.type == "cpu":
            return torch.float32
        return torch.bfloat16 if native_bf16(device) else torch.float16
    return getattr(torch, name)


def flash_attention_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why flash_attention_2 cannot run this model here, or None."""
    if device.type != "cuda":
        return f"it needs a CUDA device, not {device}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"it needs float16 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    if compute_capability(device) < (8, 0):
        major, minor = compute_capability(device)
        return f"it needs compute capability 8.0 or later; this GPU has {major}.{minor}"
    return flash_attn_problem()


def resolve_attention(name: str, device: torch.device, dtype: torch.dtype) -> str:
    if name == "auto":
        return "flash_attention_2" if flash_attention_problem(device, dtype) is None else "sdpa"
    return name


def auto_attention(name: str, attention: str, device: torch.device, dtype: torch.dtype) -> dict:
    """LoadedModel's attention_candidates and attention_note for a model loaded with `attention`. Where
    flash_attention_2 can run, auto does not trust it blindly: both are measured at load on the run's batch
    (runner/attention.py). Elsewhere (a CPU, fp32, no flash-attn) auto is sdpa, and the note says why."""
    if name != "auto":
        return {}
    if attention == "flash_attention_2":
        return {"attention_candidates": ("flash_attention_2", "sdpa"),
                "attention_note": "auto: flash_attention_2 and sdpa both run here, not yet measured"}
    return {"attention_note": f"auto -> sdpa (flash_attention_2 not usable: {flash_attention_problem(device, dtype)})"}


def model_devices(model) -> list[torch.device]:
    """Every device the model's parameters live on, in order of first use (several with a device_map)."""
    devices: list[torch.device] = []
    for parameter in model.parameters():
        if parameter.device not in devices:
            devices.append(parameter.device)
    return devices


def _check_device_map(cfg: ModelConfig, role: str) -> None:
    device_map = getattr(cfg, "device_map", None)
    if device_map is None:
        return
    if isinstance(device_map, str):
        if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
            raise UserError(f"{role}.device_map: {device_map!r} is not known; use auto, balanced, sequential or a "
                            "mapping of module names to devices")
        return
    for module, where in device_map.items():
        if where == "disk":
            raise UserError(f"{role}.device_map: {module} on disk would time the disk, not the model; "
                            "give it a cpu or cuda:N device")
        if isinstance(where, int) and not isinstance(where, bool):
            where = f"cuda:{where}"
        if not isinstance(where, str) or not (where == "cpu" or where.startswith("cuda")):
            raise UserError(f"{role}.device_map: {module}: {where!r} is not a device; use cpu, cuda:N or an integer")
        if where.startswith("cuda"):
            resolve_device(where)


def check_model_config(cfg: ModelConfig, role: str) -> None:
    """What can be refused before anything loads."""
    if cfg.quantization.startswith("torchao"):
        if importlib.util.find_spec("torchao") is None:
            raise UserError(f"{role}.quantization: {cfg.quantization} needs torchao, which is not installed; "
                            "pip install torchao (requirements.txt pins the tested version), or set quantization: none")
        if cfg.quantization == "torchao-int4" and cfg.dtype not in ("auto", "bfloat16"):
            raise UserError(f"{role}.quantization: torchao-int4 computes in bfloat16 (its int4 matmul takes no other "
                            f"activations), but {role}.dtype is {cfg.dtype}; set {role}.dtype: bfloat16 or auto")
    elif cfg.quantization != "none" and importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(f"{role}.quantization: {cfg.quantization} needs bitsandbytes, which is not installed; "
                        "pip install bitsandbytes, or set quantization: none")
    if cfg.attn_implementation == "flash_attention_2" and not flash_attn_available():
        raise UserError(f"{role}.attn_implementation: flash_attention_2 asked but {flash_attn_problem()}; "
                        "pip install -r requirements-gpu.txt on a GPU machine (a wheel for this torch), or use auto/sdpa")
    _check_device_map(cfg, role)
    if cfg.model.startswith("synthetic:"):
        if getattr(cfg, "kind", "model") == "model":  # a synthetic head's spec is decode/head_models.py's (preflight)
            from utils.synthetic_models import parse

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


def check_exit_layers(config, hf_config=None) -> None:
    """Refuse a speculative.exit_layer the target cannot draft with: 1 .. layers - 1 (all of them is the target
    itself). hf_config: the loaded target's config (Session.load); None reads the depth from what is already
    here, and a target whose depth cannot be read that way is checked once it loads."""
    if not config.exit_layers:
        return
    depth = hf_config.get_text_config().num_hidden_layers if hf_config is not None else target_depth(config.target)
    if depth is None:
        return
    if depth < 2:
        raise ConfigError(f"config key 'speculative.exit_layer': the target ({config.target.model}) has {depth} "
                          "layer, and early exit drafts with fewer layers than the target; drop early_exit")
    too_deep = [e for e in config.exit_layers if e >= depth]
    if too_deep:
        raise ConfigError(f"config key 'speculative.exit_layer': {too_deep[0]} must be below the target's {depth} "
                          f"layers ({config.target.model}); use 1 to {depth - 1}")


def target_depth(cfg: ModelConfig) -> int | None:
    """The model's number of decoder layers from its config alone, when that costs no download, conversion or
    weights: a synthetic spec, a local folder or GGUF header, the hub cache, an offline model converted before.
    None otherwise."""
    if cfg.model.startswith("synthetic:"):
        from utils.synthetic_models import SHAPES, parse

        try:
            name, layers, _, _ = parse(cfg.model)
        except ValueError:
            return None  # check_model_config explains it
        return layers or SHAPES[name][2]
    if cfg.model in OFFLINE_MODELS:  # resolve_offline_model would convert it: read only a converted copy
        where, gguf_file = cache_root() / cfg.model, None
        if not (where / "config.json").is_file():
            return None
    else:
        where, gguf_file, _ = locate(cfg)
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(where, gguf_file=gguf_file, revision=cfg.revision, local_files_only=True)
        return hf_config.get_text_config().num_hidden_layers
    except Exception:  # not readable here (not cached, an unknown layout): the check after loading covers it
        return None


def load_model(cfg: ModelConfig, device: torch.device, role: str) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    check_model_config(cfg, role)
    dtype = resolve_dtype(cfg.dtype, device, cfg.quantization)
    attention = resolve_attention(cfg.attn_implementation, device, dtype)
    if attention == "flash_attention_2":
        problem = flash_attention_problem(device, dtype)
        if problem:
            raise ModelLoadError(f"{role}.attn_implementation: flash_attention_2 cannot run here: {problem}; use auto or sdpa")
    if cfg.model.startswith("synthetic:"):
        return _load_synthetic(cfg, device, dtype, attention, role)
    where, gguf_file, source = locate(cfg)
    kwargs = dict(dtype=dtype, attn_implementation=attention, revision=cfg.revision)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if cfg.quantization in ("4bit", "8bit"):
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=cfg.quantization == "4bit", load_in_8bit=cfg.quantization == "8bit",
            bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype)
    device_map = getattr(cfg, "device_map", None)
    if device_map is not None:  # one model over several devices, placed by accelerate as transformers does
        kwargs["device_map"] = device_map
        if getattr(cfg, "max_memory", None):
            kwargs["max_memory"] = {int(k) if str(k).isdigit() else k: v for k, v in cfg.max_memory.items()}
    elif device.type != "cpu" or cfg.quantization in ("4bit", "8bit"):
        # straight onto the device: no full copy on the host first. On a CPU, unquantized, the weights stay
        # memory-mapped from their file (release_file_mappings copies what packing leaves)
        kwargs["device_map"] = {"": device}
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=gguf_file, revision=cfg.revision)
        text_only = None if gguf_file or isinstance(device_map, dict) else text_only_config(where, cfg.revision)
        model = _load_text_model(where, text_only, kwargs) if text_only is not None else None
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(where, **kwargs)
        else:
            source += f" (its text model alone, {type(model).__name__})"
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        raise ModelLoadError(_explain(role, cfg, source, error)) from None
    model.eval()
    model.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    vocab_size = model.get_output_embeddings().weight.shape[0]
    kernels = linear_kernels(model, cfg.quantization, device)
    return LoadedModel(model, tokenizer, source, str(dtype).removeprefix("torch."), attention, cfg.quantization, vocab_size,
                       kernels, **auto_attention(cfg.attn_implementation, attention, device, dtype))


def linear_kernels(model: torch.nn.Module, quantization: str, device: torch.device) -> str:
    """The linears' kernels after loading, for the report: torchao's are put in here, bitsandbytes' were at loading."""
    if quantization.startswith("torchao"):
        return torchao_quantize(model, quantization, device)
    return f"bitsandbytes {quantization}" if quantization in ("4bit", "8bit") else "nn.Linear"


def torchao_quantize(model: torch.nn.Module, quantization: str, device: torch.device) -> str:
    """torchao's weight-only int4 or int8 in place of the model's linears; -> the kernels, for the report.

    int4 is grouped by 128 along the input and packed for the device's int4 matmul (ATen's CPU kernel; tinygemm's
    tiles on CUDA), so a linear whose input is not a multiple of 128 stays as it is. The LM head stays as it is too:
    it may share its weight with the input embedding, which a packed tensor cannot serve, and llama.cpp's Q4_K_M keeps
    it at 6 bits. The compiled and captured steps run the same tensors (torchao's subclasses trace)."""
    import logging

    # its C++ extensions are built for one torch each; the int4 and int8 paths here are ATen's and torch's own ops
    logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    head = model.get_output_embeddings()
    int4 = quantization == "torchao-int4"

    def chosen(module, _name):
        return isinstance(module, torch.nn.Linear) and module is not head and (not int4 or module.in_features % 128 == 0)

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    picked = sum(chosen(m, "") for m in linears)
    config = (Int4WeightOnlyConfig(group_size=128, int4_packing_format="opaque" if device.type == "cpu" else "tile_packed_to_4d")
              if int4 else Int8WeightOnlyConfig())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_(model, config, filter_fn=chosen)
    return f"torchao {quantization.removeprefix('torchao-')} weight-only ({picked} of {len(linears)} linears; the LM head as loaded)"


# where the text model's weights sit in a multimodal checkpoint (LLaVA-style: gemma-3, PaliGemma, Mistral-3, ...),
# as the original checkpoints and transformers 5's own layout name them -> the text-only class's names
TEXT_MODEL_KEYS = {r"^language_model\.model\.": "model.", r"^model\.language_model\.": "model.",
                   r"^language_model\.lm_head\.": "lm_head."}


def text_only_config(where: str, revision: str | None):
    """The text config of a multimodal checkpoint whose text model has a causal-LM class of its own
    (gemma-3 4B and up: Gemma3ForConditionalGeneration holds a Gemma3ForCausalLM's weights next to a vision
    tower), or None: a plain causal LM, or a config not readable here (from_pretrained then explains)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        hf_config = AutoConfig.from_pretrained(where, revision=revision)
    except Exception:
        return None
    text = hf_config.get_text_config(decoder=True)
    if text is hf_config or type(text) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        return None
    return text


def _load_text_model(where: str, text_config, kwargs: dict):
    """The text-only causal LM of a multimodal checkpoint, or None when the checkpoint's text weights are
    not all found under TEXT_MODEL_KEYS (the caller then loads the full model). The vision weights are left
    on disk, which transformers reports as unexpected keys: that report is silenced, and missing keys are
    checked here instead."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(where, config=text_config, key_mapping=TEXT_MODEL_KEYS,
                                                           output_loading_info=True, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
    if info["missing_keys"] or info["mismatched_keys"]:
        del model
        return None
    return model


def _load_synthetic(cfg: ModelConfig, device, dtype, attention: str, role: str) -> LoadedModel:
    from utils.synthetic_models import build_model

    if cfg.quantization in ("4bit", "8bit"):
        raise ModelLoadError(f"{role}.quantization: synthetic models are not quantized by bitsandbytes; set "
                             "quantization: none, torchao-int4 or torchao-int8")
    try:
        model, tokenizer = build_model(cfg.model, dtype, attention, device)
    except ValueError as error:
        raise ModelLoadError(f"{role}.model: {error}") from None
    model = model.to(device).eval().requires_grad_(False)
    tokenizer.padding_side = "left"
    vocab_size = model.get_output_embeddings().weight.shape[0]
    kernels = linear_kernels(model, cfg.quantization, device)
    return LoadedModel(model, tokenizer, cfg.model, str(dtype).removeprefix("torch."), attention, cfg.quantization,
                       vocab_size, kernels, **auto_attention(cfg.attn_implementation, attention, device, dtype))


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


def release_file_mappings(model) -> int:
    """Copy every CPU parameter and buffer that still lives in a memory-mapped weight file into memory of
    its own, one tensor at a time, so the mapping closes.

    transformers loads safetensors by mmap: on a CPU the weights stay pages of the file. Once the oneDNN
    packing has made its own copies of the linear weights, the tensors left behind (embeddings, norms) still
    hold the file mapped. Each is copied, and its file pages leave the resident set at once, so the peak
    extra memory is one tensor. Returns how many tensors were copied.
    """
    from utils.memory import drop_file_pages, file_mapped_ranges

    ranges = file_mapped_ranges()
    copied = 0
    with torch.no_grad():
        for module in model.modules():
            for name, tensor in list(module._parameters.items()) + list(module._buffers.items()):
                if tensor is None or tensor.device.type != "cpu" or not _in_ranges(tensor, ranges):
                    continue
                mapped = tensor.data
                tensor.data = mapped.clone()
                drop_file_pages(mapped, ranges)
                copied += 1
    import gc

    gc.collect()
    return copied


def _in_ranges(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    address = tensor.data_ptr()
    return any(start <= address < stop for start, stop in ranges)


def load_tokenizer(cfg: ModelConfig, role: str):
    """The tokenizer alone (a run whose methods all run in another engine loads no model here), left padding as load_model's."""
    from transformers import AutoTokenizer

    check_model_config(cfg, role)
    where, gguf_file, source = locate(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=gguf_file, revision=cfg.revision)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        raise ModelLoadError(_explain(role, cfg, source, error)) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def generation_eos(cfg: ModelConfig) -> list[int]:
    """The eos ids of the model's generation_config.json, without loading the model ([] where there is none)."""
    from transformers import GenerationConfig

    where, gguf_file, _ = locate(cfg)
    try:
        eos = GenerationConfig.from_pretrained(where, revision=cfg.revision).eos_token_id
    except Exception:  # no generation_config.json (a GGUF file, a bare folder): the tokenizer's eos alone
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [] if eos is None else [eos]
