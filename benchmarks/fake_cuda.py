"""torch.cuda as one CUDA device on a CPU, for a clock: gpu_session.py's dry run marks its rounds with these events,
and tests/decode/test_host_syncs.py counts a round's synchronizes through them."""
import time

import torch


class FakeEvent:
    """torch.cuda.Event on a CPU: its time is the host's at record()."""

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.at - self.at) * 1000.0


def fake_cuda(clock, synchronize, set_attr=setattr) -> list:
    """Make clock believe it times one CUDA device: torch.cuda.synchronize becomes synchronize(device=None), its
    events FakeEvents, its current stream None. set_attr patches (pytest's monkeypatch.setattr undoes its own);
    returns the (object, name, value) replaced, to put back."""
    fakes = {"synchronize": synchronize, "Event": FakeEvent, "current_stream": lambda device=None: None}
    replaced = [(torch.cuda, name, getattr(torch.cuda, name)) for name in fakes]
    for name, fake in fakes.items():
        set_attr(torch.cuda, name, fake)
    clock.cuda_devices = [torch.device("cuda", 0)]
    return replaced
