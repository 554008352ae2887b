"""An unquantized model loads straight onto its device (from_pretrained places it): it is never built on the host
and moved after. Checked without a GPU: the CUDA facts are monkeypatched and the placement request is recorded."""
import pytest
import torch
import transformers
from transformers import PreTrainedModel

from helpers import WORDS, word_tokenizer
from tiny_models import tiny_model
from utils import models
from utils.config import ModelConfig

CUDA = torch.device("cuda", 0)


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A saved tiny model; what load_model asks from_pretrained, and every .to() of a whole model."""
    tiny_model("llama", vocab_size=len(WORDS)).save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    asked, moves = [], []
    real_load, real_to = transformers.AutoModelForCausalLM.from_pretrained, torch.nn.Module.to

    def load(where, **kwargs):
        asked.append(dict(kwargs))
        kwargs.pop("device_map", None)  # no GPU here: transformers builds it on the host
        return real_load(where, **kwargs)

    def to(self, *args, **kwargs):
        if isinstance(self, PreTrainedModel):
            moves.append((args, kwargs))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    monkeypatch.setattr(torch.nn.Module, "to", to)
    monkeypatch.setattr(models, "compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(models, "_FLASH_ATTN", {"result": "flash-attn is not installed"})
    return tmp_path, asked, moves


def test_an_unquantized_model_is_placed_by_from_pretrained_not_moved_after(recorded):
    folder, asked, moves = recorded
    models.load_model(ModelConfig(model=str(folder), dtype="float32"), CUDA, "target")
    assert [kwargs["device_map"] for kwargs in asked] == [{"": CUDA}]
    assert moves == []


def test_on_a_cpu_the_weights_stay_mapped_from_their_file(recorded):
    folder, asked, moves = recorded
    models.load_model(ModelConfig(model=str(folder)), torch.device("cpu"), "target")
    assert len(asked) == 1 and "device_map" not in asked[0]  # as before: transformers' CPU load, by mmap
    assert moves == []
