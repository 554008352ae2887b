"""Models and cache layers on several devices (a target split by a device map, a draft on another GPU), simulated
on a CPU: a tensor tagged with a fake device ("cuda:1") says it lives there, a torch-function mode moves tensors
between fake devices by re-tagging them and records every op whose tensor arguments sit on different devices,
as a GPU run would refuse them. Plain tensors are on the engine's device (the CPU here); 0-d ones may mix, as on
a GPU."""
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.kv import KVState
from tiny_models import VOCAB, ragged_batch, tiny_model


class Tagged(torch.Tensor):
    """A CPU tensor that says it lives on the fake device `tag`."""
    __torch_function__ = torch._C._disabled_torch_function_impl
    tag: str

    @property
    def device(self):
        return torch.device(self.tag)


def tag_as(tensor: torch.Tensor, tag: str | None):
    if tag is None:
        return tensor
    tagged = tensor.as_subclass(Tagged)
    tagged.tag = tag
    return tagged


def plain(value):
    return value.as_subclass(torch.Tensor) if isinstance(value, Tagged) else value


def where(value) -> str | None:
    """A tensor's device as this test sees it: a tag, "cpu", or None for a 0-d plain tensor (allowed to mix)."""
    if isinstance(value, Tagged):
        return value.tag
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return "cpu"
    return None


class FakeDevices(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.mixed = []  # (op, devices) of every op over tensors on different devices
        self.moves = []  # (from, to) of every copy between devices

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = None  # the fake device a factory places its result on
        if func is torch.Tensor.to or func is torch.Tensor.cpu:
            device, dtype = (torch.device("cpu"), None) if func is torch.Tensor.cpu else \
                torch._C._nn._parse_to(*args[1:], **kwargs)[:2]
            source = where(args[0]) or "cpu"
            result = plain(args[0]) if dtype is None else plain(args[0]).to(dtype)
            if device is None or str(device) == source:
                return tag_as(result, None if source == "cpu" else source) if result is not plain(args[0]) else args[0]
            self.moves.append((source, str(device)))
            return tag_as(result.clone(), str(device) if device.type != "cpu" else None)
        if isinstance(kwargs.get("device"), (str, torch.device)) and torch.device(kwargs["device"]).type != "cpu":
            target = str(torch.device(kwargs["device"]))  # a factory (arange, empty, ...) on a fake device
            kwargs = {**kwargs, "device": "cpu"}
        devices = {d for d in map(where, tree_flatten((args, kwargs))[0]) if d is not None}
        if len(devices) > 1:
            self.mixed.append((getattr(func, "__name__", str(func)), sorted(devices)))
        if target is None:
            target = next((d for d in sorted(devices) if d != "cpu"), None)
        plain_args, plain_kwargs = tree_map(plain, (args, kwargs))
        out = func(*plain_args, **plain_kwargs)
        if plain_args and out is plain_args[0]:  # in place
            return args[0]
        return tree_map(lambda v: tag_as(v, target) if type(v) is torch.Tensor else v, out)


def prefilled_with_holes(lengths=(2, 9, 4, 6)):
    model = tiny_model("llama", seed=1, layers=3)
    ids, mask = ragged_batch(list(lengths), seed=3)
    state = KVState()
    with torch.inference_mode():
        state.forward(model, ids, mask, last_only=True)
        state.forward(model, torch.full((len(lengths), 4), 7))
    state.keep_prefix_of_last(4, torch.tensor([1, 4, 2, 4]), 4)  # holes below the threshold
    return state


LAYER_DEVICES = ["cuda:1", "cuda:2", "cuda:2"]  # a target split over two GPUs; the engine (mask) on another


def test_cache_layers_are_indexed_on_their_own_devices():
    state, reference = prefilled_with_holes(), prefilled_with_holes()
    for layer, device in zip(state.cache.layers, LAYER_DEVICES):
        layer.keys, layer.values = tag_as(layer.keys, device), tag_as(layer.values, device)
    fake = FakeDevices()
    with torch.inference_mode(), fake:
        state.select_rows(torch.tensor([0, 2, 3]))  # a row finished
        select_moves = list(fake.moves)
        state.compact()
    reference.select_rows(torch.tensor([0, 2, 3]))
    reference.compact()
    assert fake.mixed == []
    # one copy of the index per device, not per layer (3 layers, keys and values: 6 uses)
    assert sorted(select_moves) == [("cpu", "cuda:1"), ("cpu", "cuda:2")]
    assert sorted(fake.moves[len(select_moves):]) == [("cpu", "cuda:1"), ("cpu", "cuda:2")]
    assert state.compactions == 1
    for layer, expected, device in zip(state.cache.layers, reference.cache.layers, LAYER_DEVICES):
        assert layer.keys.tag == device and layer.values.tag == device
        assert torch.equal(plain(layer.keys), expected.keys) and torch.equal(plain(layer.values), expected.values)


class OnFakeDevice(torch.nn.Module):
    """The model as if it sat on `tag` with no accelerate hook: it records inputs from another device and
    returns its logits on `tag`."""

    def __init__(self, model, tag: str, wrong_inputs: list):
        super().__init__()
        self.inner, self.tag, self.wrong_inputs, self.config = model, tag, wrong_inputs, model.config
        embeddings = model.get_input_embeddings()
        self.embeddings = SimpleNamespace(num_embeddings=embeddings.num_embeddings,
                                          weight=tag_as(embeddings.weight, tag))

    def get_input_embeddings(self):
        return self.embeddings

    def forward(self, **inputs):
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor) and where(value) not in (self.tag, None):
                self.wrong_inputs.append((name, where(value)))
        out = self.inner(**tree_map(plain, inputs))
        out.logits = tag_as(out.logits, self.tag)
        return out


def test_draft_on_another_device_is_fed_there_and_answers_on_the_engines():
    target, draft = tiny_model("llama", seed=1, layers=2), tiny_model("llama", seed=2, layers=1)
    ids, mask = ragged_batch([5, 9, 2], seed=0)  # ragged: the draft gets an attention mask, and rows finish
    generation = Generation(max_new_tokens=10)
    wrong_inputs = []
    fake = FakeDevices()
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        with fake:
            drafter = DraftModelDrafter(OnFakeDevice(draft, "cuda:1", wrong_inputs), VOCAB, Sampling())
            spec = generate_speculative(target, drafter, ids, mask, generation, gamma=3)
    assert wrong_inputs == []
    assert fake.mixed == []
    assert ("cuda:1", "cpu") in fake.moves  # the draft's logits came back
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
