"""A model split by an explicit device map loads through accelerate, and the engine's output through it
equals the unsplit model's. On a CPU every entry is "cpu": this checks the loading path and the engine
over accelerate's hooks, not a transfer between GPUs (that needs a multi-GPU machine)."""
import torch

from decode import Clock, DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from helpers import WORDS, save_tiny_pair
from tiny_models import ragged_batch
from utils.config import ModelConfig
from utils.models import load_model, model_devices

CPU = torch.device("cpu")


def test_explicit_device_map_gives_the_same_tokens(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    target_dir, draft_dir = save_tiny_pair(tmp_path)
    seen = []
    real = AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):  # the real loader, recording what it was asked
        seen.append(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu", "model.layers.2": "cpu",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    split = load_model(ModelConfig(model=str(target_dir), device_map=device_map, max_memory={"cpu": "2GiB"}), CPU,
                       "target")
    assert seen[-1]["device_map"] == device_map and seen[-1]["max_memory"] == {"cpu": "2GiB"}
    whole = load_model(ModelConfig(model=str(target_dir)), CPU, "target")
    draft = load_model(ModelConfig(model=str(draft_dir)), CPU, "draft")
    assert model_devices(split.model) == [CPU]
    ids, mask = ragged_batch([5, 9, 3], vocab_size=len(WORDS))
    generation = Generation(max_new_tokens=12)
    clock = Clock(CPU)
    with torch.inference_mode():
        reference = generate_baseline(whole.model, ids, mask, generation, clock=clock)
        base = generate_baseline(split.model, ids, mask, generation, clock=clock)
        spec = generate_speculative(split.model, DraftModelDrafter(draft.model, split.vocab_size, Sampling()), ids, mask,
                                    generation, 3, clock=clock)
    assert [r.output_ids for r in base] == [r.output_ids for r in reference] == [r.output_ids for r in spec]
