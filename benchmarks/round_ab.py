"""The engine's speculative round, before and after a change: two checkouts run alternately in one run.

    git worktree add --detach /tmp/round-ab-before main     # the code to compare against
    OMP_NUM_THREADS=1 python benchmarks/round_ab.py --before /tmp/round-ab-before [--after .] [--alternations 7]

Each alternation runs every case once per side, in a fresh process that imports decode/ from that side's checkout
(the order of the sides flips each alternation). A case is greedy speculative decoding on tiny random llama models
(tests/tiny_models.py: a target and a noisy copy of it as the draft), a chain of gamma 4 or the static tree 3-2-1-1,
batch 1 and 4, 48 new tokens; and at batch 4 the target alone and "off", a draft model whose schedule drafts nothing
(a round that runs as the target's own step: it should read as the target alone). Per side and case it prints tok/s
(new tokens over generate_speculative's wall time: the median, and the range, over the alternations of each process's
median over --repeats runs after a warm-up), host syncs per round (reads and pageable copies, counted as
tests/decode/test_host_syncs.py counts them, and clock reads), and whether the tokens are identical between the sides
and to the target's own (generate_baseline).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [(layout, batch) for layout in ("chain", "tree") for batch in (1, 4)] + [("target", 4), ("off", 4)]
GAMMA, TREE, NEW_TOKENS = 4, [3, 2, 1, 1], 48


def worker(root: Path, repeats: int) -> dict:
    """Runs every case with the decode/ of `root`; returns {case: {"tok_s", "reads", "copies", "clock", "tokens",
    "equals_target"}}."""
    for path in (root / "tests" / "decode", root / "tests", root):
        sys.path.insert(0, str(path))
    import torch

    from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
    from decode.drafters.draft_tree import StaticTree
    from decode.drafters.schedules import Schedule
    from decode.tree_layout import static_parents
    from test_host_syncs import CountingClock, _Copies, _Reads
    from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model

    torch.set_num_threads(1)
    sampling = Sampling(False)
    generation = Generation(NEW_TOKENS, sampling)
    target = tiny_model("llama", seed=1, layers=4, hidden=128)
    draft = noisy_copy(target, 0.1)

    class Off(Schedule):  # no row ever drafts
        idles_rows = True

        def lengths(self):
            return [0] * self.rows

    results = {}
    for layout, batch in CASES:
        ids, mask = ragged_batch([9, 14, 6, 11][:batch], seed=3)

        def run(clock=None):
            if layout == "target":
                return generate_baseline(target, ids, mask, generation, clock=clock)
            tree = StaticTree(static_parents(TREE), sampling) if layout == "tree" else None
            schedule = Off(GAMMA) if layout == "off" else None
            drafter = DraftModelDrafter(draft, VOCAB, sampling, tree=tree, schedule=schedule)
            return generate_speculative(target, drafter, ids, mask, generation, GAMMA, clock=clock)

        with torch.inference_mode():
            own = [r.output_ids for r in generate_baseline(target, ids, mask, generation)]
            run()  # warm-up
            speeds = []
            for _ in range(repeats):
                start = time.perf_counter()
                records = run()
                speeds.append(sum(r.new_tokens for r in records) / (time.perf_counter() - start))
            log = []
            clock = CountingClock(log)
            with _Copies(log), _Reads(log):
                counted = run(clock)
        rounds = max(r.target_forwards - 1 for r in counted)
        # after the start, the prefill and the draft's prefill (the target alone marks neither: its one read at the
        # prefill, its first token, is left out by count)
        alone = layout == "target"
        in_rounds = log[clock.marks[0 if alone else 3]:]
        tokens = [r.output_ids for r in records]
        results[f"{layout} batch {batch}"] = {
            "tok_s": statistics.median(speeds), "rounds": rounds,
            "reads": (sum(e[0] == "read" for e in in_rounds) - alone) / rounds,
            "copies": sum(e[0] == "pageable copy" for e in in_rounds) / rounds,
            "clock": (len(clock.marks) - (1 if alone else 3)) / rounds, "tokens": tokens,
            "equals_target": tokens == own and [r.output_ids for r in counted] == own}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="the checkout to compare against")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--alternations", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case in each process")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker.resolve(), args.repeats)))
        return
    if args.before is None:
        parser.error("--before: the checkout to compare against (e.g. a worktree of main)")
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    for name, root in sides.items():
        if not (root / "decode" / "generate.py").is_file():
            parser.error(f"--{name} {root}: not a checkout of this project (no decode/generate.py)")
    runs = {name: [] for name in sides}
    for alternation in range(args.alternations):
        order = list(sides) if alternation % 2 == 0 else list(sides)[::-1]
        for name in order:
            out = subprocess.run([sys.executable, __file__, "--worker", str(sides[name]), "--repeats",
                                  str(args.repeats)], cwd=sides[name], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{name} ({sides[name]}) failed:\n{out.stderr[-3000:]}")
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"alternation {alternation + 1}/{args.alternations} done", file=sys.stderr)
    print(f"greedy speculative, tiny llama (4 layers, hidden 128) and a noisy copy as the draft, {NEW_TOKENS} new "
          f"tokens, gamma {GAMMA} / tree {'-'.join(map(str, TREE))}; tok/s: median of {args.alternations} "
          f"alternations (each the median of {args.repeats} runs)")
    print(f"{'case':<14} {'before tok/s (range)':>20} {'after tok/s (range)':>20} {'after/before':>12}  "
          "syncs/round before -> after (reads, pageable copies, clock reads)  same tokens, = target's")
    for case in runs["before"][0]:
        speeds = {name: [run[case]["tok_s"] for run in runs[name]] for name in sides}
        shown = {name: f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" for name, v in speeds.items()}
        ratio = statistics.median(speeds["after"]) / statistics.median(speeds["before"])
        syncs = {name: "{reads:.2f}, {copies:.2f}, {clock:.2f}".format(**runs[name][0][case]) for name in sides}
        same = all(run[case]["tokens"] == runs["before"][0][case]["tokens"] for name in sides for run in runs[name])
        own = all(run[case]["equals_target"] for name in sides for run in runs[name])
        print(f"{case:<14} {shown['before']:>20} {shown['after']:>20} {ratio:>12.2f}  "
              f"{syncs['before'] + '  ->  ' + syncs['after']:<66} {same}, {own}")
    for name in sides:
        ratios = [run["off batch 4"]["tok_s"] / run["target batch 4"]["tok_s"] for run in runs[name]]
        print(f"off / the target alone, {name}: {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}), "
              "each alternation's ratio in one process")

if __name__ == "__main__":
    main()
