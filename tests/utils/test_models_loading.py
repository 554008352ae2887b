"""What loading picks on a GPU, checked with monkeypatched CUDA facts (no GPU here), and the device map."""
import sys
import types

import pytest
import torch

from utils import UserError
from utils import models
from utils.config import ModelConfig

CUDA = torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch):
    """A fake GPU of a given compute capability, with or without an importable flash_attn."""
    def make(capability, flash: str):
        monkeypatch.setattr(models, "compute_capability", lambda device: capability)
        monkeypatch.setattr(models, "_FLASH_ATTN", {})
        monkeypatch.setattr(models.importlib.util, "find_spec",
                            lambda name, *a: None if (name == "flash_attn" and flash == "absent") else object())
        if flash == "broken":  # installed, but built for another torch: the import itself fails
            monkeypatch.setitem(sys.modules, "flash_attn", None)  # `import flash_attn` raises ImportError
        elif flash == "ok":
            monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    return make


def test_broken_flash_attn_falls_back_to_sdpa(gpu):
    gpu((9, 0), "broken")
    assert models.resolve_attention("auto", CUDA, torch.bfloat16) == "sdpa"
    assert "does not import" in models.flash_attn_problem()


def test_explicit_flash_attention_on_a_broken_install_is_one_clear_error(gpu):
    gpu((9, 0), "broken")
    with pytest.raises(UserError, match="target.attn_implementation: flash_attention_2 asked but flash-attn is "
                                        "installed but does not import"):
        models.check_model_config(ModelConfig(model="x/y", attn_implementation="flash_attention_2"), "target")


def test_pre_ampere_gpu_gets_float16_and_sdpa(gpu):
    gpu((7, 5), "ok")  # a T4: bf16 only emulated, no flash-attn 2
    assert models.resolve_dtype("auto", CUDA) == torch.float16
    assert models.resolve_attention("auto", CUDA, torch.float16) == "sdpa"
    assert "compute capability 8.0" in models.flash_attention_problem(CUDA, torch.float16)


def test_ampere_with_flash_attn_gets_bf16_and_flash_attention(gpu):
    gpu((8, 0), "ok")
    assert models.resolve_dtype("auto", CUDA) == torch.bfloat16
    assert models.resolve_attention("auto", CUDA, torch.bfloat16) == "flash_attention_2"
    assert models.resolve_attention("auto", CUDA, torch.float32) == "sdpa"  # flash-attn has no fp32 kernels


def test_cpu_never_picks_flash_attention(gpu):
    gpu((9, 0), "ok")
    assert models.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert models.resolve_attention("auto", torch.device("cpu"), torch.float32) == "sdpa"


@pytest.mark.parametrize("device_map, fragment", [
    ({"model.layers.0": "disk"}, "on disk"),
    ({"model.layers.0": "tpu:0"}, "is not a device"),
    ({"model.layers.0": "cuda:0"}, "CUDA is not available"),
    ("everywhere", "is not known"),
])
def test_bad_device_maps_are_refused_before_loading(device_map, fragment):
    with pytest.raises(UserError, match=fragment):
        models.check_model_config(ModelConfig(model="x/y", device_map=device_map), "target")
