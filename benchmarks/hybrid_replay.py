"""Replay a run's drafting decisions offline: hybrid's gate (and prompt lookup, suffix decoding and the draft model at
constant gamma) on the run's own prompts and greedy outputs, priced by the run's own cost probes, in seconds instead of
the hour a rerun takes. What it is for: trying a change to hybrid's gate (a variant: HybridDrafter's keywords) on
every prompt of a run before timing it, and a bound on what any per-round gate could reach.

    python benchmarks/hybrid_replay.py RUN_DIR [--variant NAME=JSON ...] [--bound] [--json OUT.json]

How: greedy decoding's output is the target's, whatever drafts, so the baseline's recorded output is every method's.
Each request replays round by round through the real drafters (decode/drafters: NgramIndex, SuffixSource, the
HybridDrafter with its pools, start records and suffix cache kept across requests as the run keeps them, the untimed
warmup included); the draft model's tokens come from one teacher-forced forward of the draft over the prompt and the
output (its argmax and top probability at every position: what it drafts while its chain follows the output; after
its first miss, a token that misses). Each round costs its target verification at its width (costs.json's steps,
interpolated), plus the draft's forwards (its step, and a first forward that feeds more than one token on the run's
draft prefill line), in the run's probes' seconds; a request adds its recorded prefill. The gate reads the run's own
c, v and draft prefill line (progress.json's cost probe).

Checks printed beside the figures: each method's measured speedup where the run has it, and the share of hybrid's
rounds replayed exactly as recorded (drafted, accepted, sources). Prompt lookup and suffix replay their recorded rounds
exactly; the draft's rounds agree unless its teacher-forced argmax differs from its cached one (a near tie).

--bound: each round's plan chosen from its realised acceptance (hindsight), the draft's prefill paid where it starts:
a ceiling for any per-round gate over these sources and costs (it is myopic: a round that pays now may cost later).
Beside it the same gate knowing only the free sources' outcomes, or only the draft model's (the other sources by the
gate's own estimates): which estimate the gap to the ceiling is in. And for hybrid's own rounds, how often each
source's first token was right and how well the gate's estimate b_1 ranked right above wrong (AUC), with the draft's
own top probability beside it (which the gate cannot read: it is known once the draft's forward has run).

Limits (refused with one line, exit 2): greedy runs of our engine at batch 1 without a load; draft_context points are
skipped (the teacher-forced draft reads the whole context); the first draft of the config is the draft model.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from decode.drafters.base import Drafter, Proposal, unpadded  # noqa: E402
from decode.drafters.draft_model import DraftModelDrafter  # noqa: E402
from decode.drafters.hybrid import FREE, HybridDrafter, LengthRecord, plan_row  # noqa: E402
from decode.drafters.prompt_lookup import PromptLookupDrafter  # noqa: E402
from decode.drafters.suffix import SuffixCache, SuffixDrafter, prompt_key  # noqa: E402
from decode.k_model import round_parts  # noqa: E402
from decode.methods.suffix import Options as SuffixOptions  # noqa: E402
from decode.names import TARGET, draft_model  # noqa: E402

METHODS = ("speculative", "prompt_lookup", "suffix", "hybrid")
MAX_DEPTH, MIN_PROB, CACHE_TOKENS = (SuffixOptions().suffix_max_depth, SuffixOptions().suffix_min_prob,
                                     SuffixOptions().suffix_cache_tokens)  # the config's defaults


class ReplayError(Exception):
    """A run this replay cannot read: one line, exit 2."""


class Prices:
    """The run's costs in seconds: target steps by width (costs.json), the draft's step and prefill line, and the
    gate's inputs c, v and draft_prefill as the run measured them (progress.json)."""

    def __init__(self, run: Path, draft: str):
        profile = json.loads((run / "costs.json").read_text())
        steps = sorted((p["width"], p["s"]) for p in profile["steps"] if p["model"] == TARGET and p["rows"] == 1)
        drafts = [p["s"] for p in profile["steps"] if p["model"] == draft_model(draft) and p["rows"] == 1]
        probes = list(json.loads((run / "progress.json").read_text()).get("costs", {}).get("1", {}).values())
        if len(steps) < 2 or not drafts or not probes:
            raise ReplayError(f"{run}: no batch-1 cost probe of the target and {draft} (costs.json, progress.json)")
        self.widths = np.array([w for w, _ in steps], dtype=float)
        self.seconds = np.array([s for _, s in steps], dtype=float)
        probe = probes[0]
        self.target_s = float(probe["target_forward_s"])
        self.c = float(probe["c_by_draft"][draft])
        self.v = {int(k): float(x) for k, x in probe["v"].items()}
        self.prefill = (probe.get("draft_prefill") or {}).get(draft)
        self.draft_s = float(drafts[0])

    def verify(self, nodes: int) -> float:
        """A target forward over the last token and `nodes` drafts; past the widest measured, its last slope."""
        width = nodes + 1
        if width <= self.widths[-1]:
            return float(np.interp(width, self.widths, self.seconds))
        slope = (self.seconds[-1] - self.seconds[-2]) / (self.widths[-1] - self.widths[-2])
        return float(self.seconds[-1] + slope * (width - self.widths[-1]))

    def draft_first(self, width: int) -> float:
        """The draft's first forward of a round: a step, or its prefill line where it feeds more than one token."""
        if width <= 1 or self.prefill is None:
            return self.draft_s
        return max(self.draft_s, (self.prefill["fixed"] + self.prefill["per_token"] * width) * self.target_s)


class TeacherForcedDraft(Drafter):
    """DraftModelDrafter's part that HybridDrafter and the constant schedule use, with the draft's tokens from its
    teacher-forced argmax over each request's prompt and output (`forced`: prompt ids -> (ids, argmax, top
    probability)). `pos[row]`: the row's committed tokens, set by the replay before each round. `spent`: seconds of
    draft forwards since it was last zeroed."""

    def __init__(self, forced: dict, prices: Prices, input_vocab_size: int, vocab_size: int):
        self.forced, self.prices = forced, prices
        self.input_vocab_size, self.vocab_size = input_vocab_size, vocab_size
        self.schedule = self.tree = None
        self.defer = False
        self.spent, self.count, self.state = 0.0, 0, None

    @property
    def forwards(self) -> int:
        return self.count

    started = DraftModelDrafter.started  # the draft model's own bookkeeping where it touches no model
    _lengths = DraftModelDrafter._lengths
    _no_drafts = DraftModelDrafter._no_drafts
    held_rows = DraftModelDrafter.held_rows  # one row at a time: never holds, but the hybrid asks

    def reset(self):
        self.state, self.pending, self.rows, self.pos = None, [], [], []
        self._observed = self._observed_drafts = None
        if self.schedule is not None:
            self.schedule.start(0)

    def add_rows(self, prompt_ids, prompt_mask, host=None):
        prompts = unpadded(prompt_ids, prompt_mask, host)
        self.rows += [self.forced[tuple(p)] for p in prompts]
        self.pos += [len(p) + 1 for p in prompts]
        if self.schedule is not None:
            self.schedule.add_rows(len(prompts))
        if self.defer and self.state is None:
            self.pending += [list(p) for p in prompts]
            return
        self.pending += [[] for _ in prompts]
        self.spent += self.prices.draft_first(max(len(p) for p in prompts))
        self.count += 1
        self.state = True

    def propose(self, last_tokens, max_tokens, row_limits=None):
        lengths = self._lengths(max_tokens, row_limits)
        longest = max(lengths, default=0)
        if longest == 0:
            return self._no_drafts(last_tokens)
        width = 1 + max(len(p) for p in self.pending)
        self.pending = [[] for _ in self.pending]
        self.state = True
        stops = self.schedule is not None and self.schedule.stops_mid_round
        tokens = []
        for row, (ids, argmax, top) in enumerate(self.rows):
            drafted, on_path = [], True
            for step in range(longest):
                at = self.pos[row] + step  # the position this step drafts
                if on_path and at < len(ids):
                    token = argmax[at - 1]
                    on_path = token == ids[at]
                else:  # off the output: a token the target rejects
                    token = (ids[at] + 1) % self.vocab_size if at < len(ids) else 0
                drafted.append(token)
                # the confidence stop reads the top probability where the chain follows the output, its proxy after
                if stops and step < lengths[row] and top[min(at - 1, len(top) - 1)] < self.schedule.threshold:
                    lengths[row] = step + 1
            tokens.append(drafted)
        steps = max(lengths) if stops else longest
        self.spent += round_parts(lambda w: 0.0, self.prices.draft_first, steps, width)[0]  # the K model's round
        self.count += steps
        self.last_proposal = torch.tensor([t[:steps] for t in tokens])
        return Proposal(self.last_proposal, None, torch.tensor(lengths))

    def commit(self, accepted_len, accepted_len_host, drafted_host, path_host=None):
        width = self.last_proposal.shape[1]
        if self.schedule is not None:
            self.schedule.update(drafted_host, accepted_len_host)
        for row, accepted in enumerate(accepted_len_host):
            if width and accepted == width:  # its last draft was never fed
                self.pending[row].append(int(self.last_proposal[row, -1]))

    def select_rows(self, rows):
        raise NotImplementedError("the replay runs one row at a time")


class Hindsight(HybridDrafter):
    """--bound: each round's plan from the realised acceptance of the candidates of the sources in KNOWS (the others
    by the gate's own estimates); the draft starts where a plan wants it, its prefill priced in that round. Knowing
    all three is the ceiling; knowing only the free sources', or only the draft's, says which estimate the gap is in."""
    KNOWS = (*FREE, "draft")

    def _start_pays(self, plans):
        return any(plan[2] for plan in plans)

    def _plans(self, limits):
        plans, priors = [], self._priors()
        for row, limit in enumerate(limits):
            ids, argmax, _ = self.draft.rows[row]
            at = self.draft.pos[row]
            rates = {s: b for s, b in self._rates(row, priors).items() if s not in self.KNOWS}
            rates.update({s: [1.0 if at + i < len(ids) and token == ids[at + i] else 0.0
                              for i, token in enumerate(self.candidates[row][s])] for s in FREE if s in self.KNOWS})
            if "draft" in self.KNOWS:
                rates["draft"] = [1.0 if at + step < len(ids) and argmax[at + step - 1] == ids[at + step] else 0.0
                                  for step in range(limit)]
            lengths = {s: len(self.candidates[row][s]) for s in FREE}
            plans.append(plan_row(rates, lengths, limit, self.prices, merge=self.merge,
                                  fed=len(self.draft.pending[row]) + 1))
        return plans


class FreeKnown(Hindsight):
    KNOWS = FREE


class DraftKnown(Hindsight):
    KNOWS = ("draft",)


class Watched(HybridDrafter):
    """hybrid as the run has it, noting each round's first-token estimate b_1 of each candidate that the gate read
    (lookup, suffix, the draft model) and whether that first token was the target's: `firsts` source -> [(b_1,
    right)]; for the draft also its own top probability there (`draft_top`), known only once its forward has run."""

    def reset(self):
        super().reset()
        self.firsts = {"lookup": [], "suffix": [], "draft": [], "draft_top": []}

    def _plans(self, limits):
        priors = self._priors()
        for row in range(len(limits)):
            ids, argmax, top = self.draft.rows[row]
            at = self.draft.pos[row]
            if at >= len(ids):
                continue
            for s, rates in self._rates(row, priors).items():
                if s == "draft" or self.candidates[row][s]:
                    token = argmax[at - 1] if s == "draft" else self.candidates[row][s][0]
                    self.firsts[s].append((rates[0], token == ids[at]))
            self.firsts["draft_top"].append((top[at - 1], argmax[at - 1] == ids[at]))
        return super()._plans(limits)


def auc(pairs: list[tuple[float, bool]]) -> float | None:
    """The probability that a right first token's score is above a wrong one's (ties half): 0.5 is no better than
    chance, 1 a perfect ranking. None with no right or no wrong token."""
    right = np.array([score for score, ok in pairs if ok])
    wrong = np.array([score for score, ok in pairs if not ok])
    if not len(right) or not len(wrong):
        return None
    return float((right[:, None] > wrong[None, :]).mean() + 0.5 * (right[:, None] == wrong[None, :]).mean())


def replay_request(drafter, request: dict, gamma: int, max_new: int, prices: Prices, draft=None) -> dict:
    """One request through `drafter`, round by round against its recorded output: seconds (verification and draft
    forwards, no prefill) and its rounds as the engine records them."""
    prompt, output = request["prompt"], request["output"][:max_new]
    ids = torch.tensor([prompt])
    drafter.start(ids, torch.ones_like(ids))
    drafter.observe([output[0]])
    done, seconds, rounds = 1, 0.0, []
    while done < len(output):
        budget = min(gamma, max_new - done - 1)
        if draft is not None:
            draft.pos, draft.spent = [len(prompt) + done], 0.0
        proposal = drafter.propose(torch.tensor([output[done - 1]]), budget, row_limits=[budget]) if budget > 0 \
            else None
        path, drafted, nodes, tokens, tree = [], 0, 0, [], False
        if proposal is not None and proposal.tokens.shape[1]:
            tokens = proposal.tokens[0].tolist()
            nodes = len(tokens)
            if proposal.layout is None:
                drafted = min(budget, nodes, int(proposal.lengths[0]) if proposal.lengths is not None else nodes)
                while len(path) < drafted and done + len(path) < len(output) and \
                        tokens[len(path)] == output[done + len(path)]:
                    path.append(len(path))
            else:
                tree = True
                parents, valid = proposal.layout.parents[0], proposal.layout.valid[0]
                drafted, node = int(valid.sum()), -1
                while done + len(path) < len(output):
                    children = [i for i in range(nodes) if valid[i] and parents[i] == node
                                and tokens[i] == output[done + len(path)]]
                    if not children:
                        break
                    node = children[0]
                    path.append(node)
        accepted = len(path)
        following = output[done + accepted] if done + accepted < len(output) else 0
        drafter.observe([following], [tokens])
        if proposal is not None:
            drafter.commit(torch.tensor([accepted]), [accepted], [drafted], **({"path_host": [path]} if tree else {}))
        seconds += prices.verify(nodes) + (draft.spent if draft is not None else 0.0)
        facts = {"drafted": drafted, "accepted": accepted}
        if getattr(drafter, "round_facts", None) and proposal is not None:
            facts["sources"] = drafter.round_facts[0]["sources"]
        rounds.append(facts)
        done += min(accepted + 1, len(output) - done)
    return {"seconds": seconds, "rounds": rounds}


def load_run(run: Path):
    """(config, the first draft's label, the requests: prompt ids, the baseline's output ids and prefill seconds, the
    draft's teacher-forced argmax and top probability, group, sample_id; in the run's order), the measured records."""
    from utils.config import load_config
    from utils.data import expand_conversations, load_prompts
    from utils.models import load_model

    config, _ = load_config(run / "config.yaml")
    if config.generation.do_sample or config.load is not None or config.batch_size != [1] or not config.draft:
        raise ReplayError(f"{run}: the replay reads greedy runs of a draft model at batch_size [1] without a load")
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    base = {r["sample_id"]: r for r in records if r["method"] == "baseline"}
    if not base:
        raise ReplayError(f"{run}: no baseline records (its outputs are every method's in greedy)")
    draft = load_model(config.draft[0], torch.device("cpu"), "draft")
    tokenizer = draft.tokenizer
    prompts = load_prompts(config.dataset, tokenizer)

    def answer(token_ids):  # a conversation's earlier turn: the baseline's recorded answer to that prompt
        made = next(p for p in prompts.prompts if p.token_ids == token_ids)
        if made.sample_id not in base:
            raise ReplayError(f"{run}: no baseline record of sample {made.sample_id}, an earlier turn")
        return base[made.sample_id]["output_text"]
    prompts = expand_conversations(prompts, config.dataset, tokenizer, answer)
    requests = []
    for p in prompts.prompts:
        if p.sample_id not in base:
            continue
        output = base[p.sample_id]["output_ids"]
        output = json.loads(output) if isinstance(output, str) else list(output)
        full = list(p.token_ids) + output
        with torch.inference_mode():
            logits = draft.model(torch.tensor([full])).logits[0].float()
        requests.append({"sample_id": p.sample_id, "group": p.group, "prompt": list(p.token_ids), "output": output,
                         "argmax": logits.argmax(-1).tolist(), "top": torch.softmax(logits, -1).amax(-1).tolist(),
                         "prefill_s": base[p.sample_id]["prefill_s"]})
    vocab = (draft.vocab_size, draft.model.get_input_embeddings().num_embeddings)
    return config, config.draft[0].name, requests, records, vocab


def replay(run: Path, variants: dict, bound: bool) -> dict:
    config, label, requests, records, (vocab, input_vocab) = load_run(run)
    prices = Prices(run, label)
    options = config.speculative
    gamma = options.gamma[0]
    cap = max(gamma, options.hybrid_max_draft or 0)
    max_new = config.generation.max_new_tokens
    warm = min(max_new, 2 * config.longest_draft + 2)
    forced = {tuple(r["prompt"]): (r["prompt"] + r["output"], r["argmax"], r["top"]) for r in requests}
    groups = {tuple(r["prompt"]): r["group"] for r in requests}
    first = requests[:1] if config.warmup else []  # the warmup: the first batch, short, remembering nothing

    def fake():
        return TeacherForcedDraft(forced, prices, input_vocab, vocab)

    def hybrid(cls=HybridDrafter, **overrides):
        memory = {"pools": {}, "groups": {}, "start": {}, "cache": SuffixCache(MAX_DEPTH + cap, CACHE_TOKENS),
                  "lengths": LengthRecord()}

        def make(budget):
            draft = fake()
            keywords = dict(pools=memory["pools"], cache=memory["cache"], ngram_max=options.ngram_max,
                            ngram_min=options.ngram_min, group_pools=memory["groups"],
                            group_of=lambda prompt: groups.get(tuple(prompt)), prefill_cost=prices.prefill,
                            budget=budget, start_pools=memory["start"], confidence=options.confidence,
                            lengths=memory["lengths"])
            keywords.update(overrides)
            return cls(draft, vocab, cap, prices.c, dict(prices.v), **keywords), draft, cap, memory["cache"]
        return make

    def constant(budget):
        draft = fake()
        return draft, draft, gamma, None

    def lookup(budget):
        return PromptLookupDrafter(options.ngram_max, options.ngram_min), None, gamma, None
    suffix_cache = SuffixCache(MAX_DEPTH + gamma, CACHE_TOKENS)

    def suffix(budget):
        return SuffixDrafter(suffix_cache, MAX_DEPTH, MIN_PROB, depth=MAX_DEPTH + gamma), None, gamma, suffix_cache

    plan = {"speculative": constant, "prompt_lookup": lookup, "suffix": suffix, "hybrid": hybrid(Watched)}
    plan = {name: make for name, make in plan.items() if name in config.methods}
    plan.update({name: hybrid(**keywords) for name, keywords in variants.items()})
    if bound:
        plan.update({"bound": hybrid(Hindsight), "bound, free known": hybrid(FreeKnown),
                     "bound, draft known": hybrid(DraftKnown)})
    out, firsts = {}, None
    for name, make in plan.items():
        for request in first:
            drafter, draft, length, _ = make(warm)
            replay_request(drafter, request, length, warm, prices, draft if draft is not None else getattr(
                drafter, "draft", None))
        out[name] = {}
        for request in requests:
            drafter, draft, length, cache = make(max_new)
            draft = draft if draft is not None else getattr(drafter, "draft", None)
            result = replay_request(drafter, request, length, max_new, prices, draft)
            if cache is not None:  # the batch's output joins the point's cache of earlier outputs
                cache.remember(prompt_key(request["prompt"]), request["output"][:max_new])
            if getattr(drafter, "lengths", None) is not None:  # and its length the point's record (hybrid's)
                drafter.lengths.add(request["group"], len(request["output"][:max_new]))
            out[name][request["sample_id"]] = result
            if isinstance(drafter, Watched):  # over the point's requests
                firsts = {s: (firsts or {}).get(s, []) + pairs for s, pairs in drafter.firsts.items()}
    return {"config": config, "requests": requests, "records": records, "prices": prices, "replayed": out,
            "firsts": firsts}


def tables(result: dict) -> tuple[str, dict]:
    """Per method and group: the replayed speedup over the baseline and the measured one (prefills included in both:
    the recorded ones); hybrid's rounds replayed as recorded."""
    requests, records, prices = result["requests"], result["records"], result["prices"]
    measured = {}
    for r in records:
        if r.get("draft_context") is None:
            measured.setdefault(r["method"], {})[r["sample_id"]] = r
    groups = sorted({r["group"] for r in requests if r["group"] is not None})
    columns = [*groups, None] if groups else [None]
    # the baseline: its prefill and a 1-token step a token after the first; a method: the same prefill and its rounds
    base = {r["sample_id"]: prices.verify(0) * (len(r["output"]) - 1) + r["prefill_s"] for r in requests}
    prefill = {r["sample_id"]: r["prefill_s"] for r in requests}
    figures, lines = {}, []
    lines.append("| method | " + " | ".join(g or "overall" for g in columns) + " |")
    lines.append("|---" * (len(columns) + 1) + "|")
    for name, replayed in result["replayed"].items():
        cells, figures[name] = [], {}
        for group in columns:
            ids = [r["sample_id"] for r in requests if group is None or r["group"] == group]
            sim = sum(base[i] for i in ids) / sum(replayed[i]["seconds"] + prefill[i] for i in ids)
            cell, real = f"{sim:.2f}", None
            if name in measured and all(i in measured[name] for i in ids) and "baseline" in measured:
                real = sum(measured["baseline"][i]["latency_s"] for i in ids) / \
                    sum(measured[name][i]["latency_s"] for i in ids)
                cell += f" ({real:.2f})"
            figures[name][group or "overall"] = {"replayed": sim, "measured": real}
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    agreement = {}
    for name in ("hybrid", "prompt_lookup", "suffix"):
        if name not in measured or name not in result["replayed"]:
            continue
        same = total = 0
        for i, replayed in result["replayed"][name].items():
            rounds = measured[name][i]["rounds"]
            rounds = json.loads(rounds) if isinstance(rounds, str) else rounds or []
            keys = ("drafted", "accepted", "sources")
            recorded = [{k: rd[k] for k in keys if k in rd} for rd in rounds]
            same += sum(a == {k: b[k] for k in keys if k in b} for a, b in zip(replayed["rounds"], recorded))
            total += max(len(recorded), len(replayed["rounds"]))
        agreement[name] = same / max(total, 1)
    text = "\n".join(lines) + "\n\nreplayed (measured) speedup over the baseline; rounds replayed as recorded: " + \
        ", ".join(f"{name} {share:.0%}" for name, share in agreement.items()) + "\n"
    predictable = {}
    if result.get("firsts"):
        predictable = {source: {"rounds": len(pairs), "right": sum(ok for _, ok in pairs) / max(len(pairs), 1),
                                "auc": auc(pairs)} for source, pairs in result["firsts"].items()}
        text += "hybrid's first tokens, how often right and how well ranked (AUC) by the gate's estimate b_1 (the " \
                "draft's own top probability: draft_top, known only after its forward): " + ", ".join(
                    f"{source} {p['right']:.2f} of {p['rounds']}, AUC " + ("-" if p["auc"] is None else f"{p['auc']:.2f}")
                    for source, p in predictable.items()) + "\n"
    return text, {"speedup": figures, "rounds_as_recorded": agreement, "first_tokens": predictable}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a report folder of a greedy batch-1 run (samples.jsonl, costs.json)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                        help='hybrid with HybridDrafter keywords changed, e.g. nostop=\'{"confidence": null}\'')
    parser.add_argument("--bound", action="store_true", help="add the hindsight gate (a ceiling)")
    parser.add_argument("--json", type=Path, help="also write the figures here (strict JSON)")
    args = parser.parse_args(argv)
    try:
        variants = {}
        for item in args.variant:
            name, _, text = item.partition("=")
            try:
                variants[name] = json.loads(text)
            except json.JSONDecodeError as error:
                raise ReplayError(f"--variant {item!r}: its keywords are not JSON ({error})") from error
            if not name or not isinstance(variants[name], dict):
                raise ReplayError(f"--variant {item!r}: write NAME={{\"keyword\": value}}")
        for needed in ("config.yaml", "samples.jsonl", "costs.json", "progress.json"):
            if not (args.run / needed).is_file():
                raise ReplayError(f"{args.run}: no {needed}; give a report folder of a run of our engine")
        result = replay(args.run, variants, args.bound)
    except ReplayError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text, figures = tables(result)
    print(text, end="")
    if args.json is not None:
        from utils.io import write_json
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
