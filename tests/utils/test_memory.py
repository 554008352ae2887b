"""Host memory is reported as it is, and weights do not stay mapped from their files after loading."""
import time
from pathlib import Path

import pytest
import torch

from helpers import word_tokenizer
from tiny_models import tiny_model
from utils.config import ModelConfig
from utils.cpu_linear import pack_linears
from utils.memory import PeakSampler, host_memory, mapped_files
from utils.models import load_model, release_file_mappings

HAS_PROC = Path("/proc/self/status").exists()


@pytest.mark.skipif(not HAS_PROC, reason="needs /proc (Linux)")
def test_host_memory_reads_the_kernel_counters():
    memory = host_memory()
    assert all(isinstance(memory[k], int) for k in ("rss_bytes", "anon_bytes", "file_bytes", "peak_rss_bytes"))
    assert memory["peak_rss_bytes"] >= memory["rss_bytes"]
    sampler = PeakSampler(interval_s=0.01).start()
    block = torch.ones(256 * 1024 * 1024 // 4)  # 256 MiB of anonymous memory, touched
    during = host_memory()["anon_bytes"]
    time.sleep(0.2)  # the sampler's thread takes a reading while the block is alive
    del block
    report = sampler.stop()
    assert report["peak_anon_bytes"] >= during  # the sampler saw the peak even though the block is gone


@pytest.mark.skipif(not HAS_PROC, reason="needs /proc (Linux)")
def test_no_weight_file_stays_mapped_after_loading_and_packing(tmp_path):
    folder = tmp_path / "model"
    tiny_model("llama", layers=2, hidden=128).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    loaded = load_model(ModelConfig(model=str(folder)), torch.device("cpu"), "target")
    weights = str(folder / "model.safetensors")
    assert weights in mapped_files(), "the loader no longer maps safetensors: this test checks nothing"
    pack_linears(loaded.model)
    assert weights in mapped_files()  # embeddings and norms still point into the file
    before = {n: p.detach().clone() for n, p in loaded.model.named_parameters()}
    assert release_file_mappings(loaded.model) > 0
    assert weights not in mapped_files()
    for name, parameter in loaded.model.named_parameters():  # the same values, in memory of their own
        assert torch.equal(parameter, before[name]), name
