"""python -m runner.profile --config CONFIG.yaml [--rows 1,2,4] [--kv 128,512] [--prompt-tokens 128] [--reps 5]
[--passes 3] [--out PATH] [--set KEY=VALUE ...]

A cost profile (eval/costs.py, #33) of a config's target and draft model(s) on its device, dtype and engine.compile,
with no benchmark: the models load as a run loads them (runner/loading.py), no dataset is read (the prompts are
random ids in the target's vocabulary, seeded by the config's seed), and each step is timed by the run's own probes
(runner/probes.py measure_costs):

- for each rows R (default: the config's batch sizes; under a load, 1, its concurrencies and the most requests in
  flight) and each cache length K (default: the prompt, and the prompt + generation.max_new_tokens): the target's
  1-token step, its verification of every width the config's speculative points verify (gamma + 1, a tree's
  nodes + 1) and each draft's 1-token step and 2-token one (a round's first after a full accept), at a cache of K
  tokens;
- the prefills of R prompts of --prompt-tokens P tokens (and of one), by each model, and of one prompt of 2P.

The repetitions are spread over --passes passes over every rows x cache (default 3, at most --reps): a slow spell of
the machine (another process, a neighbour on a shared host) then touches every probe alike instead of pricing one
batch size's steps above the others'. Within a pass each probe's steps are interleaved, as a run's probes are.

Written as strict JSON to --out (default results/profile-<config name>-<device>.json); the last line printed is
its path. Bad input is one line and exit 2, as launch.py's.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
import warnings
from pathlib import Path

from decode.methods import HOME_ENGINE
from utils import positive_ints

ROOT = Path(__file__).resolve().parents[1]
# runner/experiment.py's exit codes (not imported: a bad argument is refused before anything heavy loads)
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_POINTS_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_PROMPT_TOKENS = 128
DEFAULT_REPS = 5
DEFAULT_PASSES = 3
RAGGED_PADDING = 8  # leading padding tokens of every row but the first in a profiled batch


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, like every other bad input (launch.py's Parser)
        print(f"error: {message}; see python -m runner.profile --help", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def positive_int(text: str) -> int:
    values = positive_ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not one positive integer")
    return values[0]


def arguments(argv: list[str] | None):
    parser = Parser(prog="python -m runner.profile",
                    description="Profile the cost of a config's models' steps and prefills (eval/costs.py), with no "
                                "benchmark and no dataset.")
    parser.add_argument("--config", required=True, help="experiment YAML: its target, drafts, device, dtype, "
                                                        "engine.compile, gammas and trees")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key by its dotted path, value in YAML (repeatable)")
    parser.add_argument("--rows", type=positive_ints, help="batch sizes, e.g. 1,2,4 (default: the config's batch "
                                                           "sizes; under a load 1, its concurrencies and the most)")
    parser.add_argument("--kv", type=positive_ints, help="cache lengths in tokens, each at least --prompt-tokens "
                                                         "(default: P and P + generation.max_new_tokens)")
    parser.add_argument("--prompt-tokens", type=positive_int, default=DEFAULT_PROMPT_TOKENS,
                        help=f"prompt width P (default {DEFAULT_PROMPT_TOKENS})")
    parser.add_argument("--reps", type=positive_int, default=DEFAULT_REPS,
                        help=f"timed repetitions of each step (default {DEFAULT_REPS}; a prefill gets 2)")
    parser.add_argument("--passes", type=positive_int, default=DEFAULT_PASSES,
                        help=f"passes over every rows x cache that share the repetitions (default {DEFAULT_PASSES}, "
                             "at most --reps): a slow spell of the machine touches every probe alike")
    parser.add_argument("--out", help="the profile's path (default results/profile-<config name>-<device>.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    command = shlex.join(["python", "-m", "runner.profile", *(sys.argv[1:] if argv is None else argv)])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    from rich.console import Console

    from utils import UserError
    from utils.config import load_config

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)
    out = None
    try:
        config, _ = load_config(args.config, args.overrides)
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        profile, out = run(config, args, command, console)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: no profile written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # a bug, not bad input: one line here, the traceback in a file (as launch.py)
        import traceback

        log = Path.cwd() / "error.log"
        log.write_text(traceback.format_exc())
        print(f"internal error: {type(error).__name__}: {' '.join(str(error).split())[:300]} "
              f"(traceback in {log}; please report it)", file=sys.stderr)
        return EXIT_FAILED
    print_profile(profile, out, console)
    print(out)
    if profile.meta.get("failures"):  # some rows x cache not measured: said above, and in the profile's meta
        return EXIT_POINTS_FAILED if profile.steps else EXIT_FAILED
    return EXIT_OK


def default_rows(config) -> tuple[list[int], str | None]:
    """The config's batch sizes; under a load, 1, its concurrencies and the most requests in flight (no concurrency
    cap: load.requests or dataset.num_samples, the dataset not being read). And a note where that is unknown."""
    rows = set(config.batch_size)
    if config.load is None:
        return sorted(rows), None
    if config.load.concurrency:
        most = max(config.load.concurrency)
        rows |= set(config.load.concurrency)
    else:  # every request may be in flight
        most = config.load.requests or config.dataset.num_samples
    if most is None:
        return sorted(rows | {1}), ("load: no concurrency cap, and the requests are the dataset's prompts, which the "
                                    "profile does not read: rows 1 only (give --rows)")
    return sorted(rows | {1, most}), None


def our_points(config) -> list:
    """Every point of our engine in the config (runner/plan.py), as a run plans them (a load's requests do not change
    a point's gamma or tree)."""
    from runner.plan import comparisons, points_of

    requests = (config.load.requests or 1) if config.load is not None else None
    return [p for c in comparisons(config, requests) for p in points_of(config, c, engine=HOME_ENGINE)]


def speculative_widths(config) -> tuple[list[int], set[int]]:
    """The target widths to time: 1, gamma + 1 of every gamma, a tree's nodes + 1 (runner/probes.py verify_widths)
    of the config's tree points of our engine; and those only trees verify (timed through the tree path)."""
    from decode.methods import REGISTRY
    from runner.probes import verify_widths

    trees = verify_widths([p for p in our_points(config) if REGISTRY[p.method].has_rounds and p.gamma
                           and getattr(p, "tree", None) is not None])
    chains = {1} | {gamma + 1 for gamma in config.speculative.gamma}
    return sorted(chains | trees), trees - chains


def sampling_of(config):
    """The config's first temperature's sampling (greedy unless do_sample), as the comparison's probes take it."""
    from decode.settings import Sampling

    g = config.generation
    temperature = g.temperatures()[0]
    return Sampling(False) if temperature is None else Sampling(True, temperature, g.top_k, g.top_p)


def run(config, args, command: str, console):
    """Load, measure, save: the Profile and where it was written."""
    import torch

    from eval.costs import Profile, from_probe, step_point
    from runner import loading
    from runner.attention import settle_attention
    from runner.probes import RUNTIME_ERRORS, environment, measure_costs, one_line, prefill_points
    from runner.session import quiet_heap
    from utils import UserError
    from utils.models import check_model_config, resolve_device

    started = time.perf_counter()
    # what a run refuses before any model loads (runner/experiment.py preflight), the dataset aside: none is read
    device = resolve_device(config.device)
    check_model_config(config.target, "target")
    for index, draft in enumerate(config.draft):
        check_model_config(draft, "draft" if len(config.draft) == 1 else f"draft[{index}]")
    prompt = args.prompt_tokens
    rows, rows_note = (args.rows, None) if args.rows else default_rows(config)
    kvs = args.kv or sorted({prompt, prompt + config.generation.max_new_tokens})
    if min(kvs) < prompt:
        raise UserError(f"--kv {min(kvs)} is below --prompt-tokens {prompt}: a cache holds the prompt; give cache "
                        f"lengths of at least {prompt}, or a smaller --prompt-tokens")
    widths, tree_widths = speculative_widths(config)
    sampling = sampling_of(config)
    device_tag = str(device).replace(":", "")
    out = Path(args.out) if args.out else ROOT / "results" / f"profile-{config.name}-{device_tag}.json"
    writable(out)

    torch.manual_seed(config.seed)
    target, drafts, clock = loading.load_models(config, device, loading.status_of(console.status))
    for _, _, loaded in loading.roles(target, drafts, models_only=True):  # attn_implementation auto, where it has a choice
        settle_attention(loaded, max(rows), max(widths), clock)
    loading.check_trees(config, target, drafts)
    if config.engine.compile:  # static buffers for these rows, and room for the longest cache and the 2P prefill
        loading.compile_models(config.model_copy(update={"batch_size": rows}), target, drafts, our_points(config),
                               max(2 * prompt, max(kvs)))
    models = {label: d.model for label, d in drafts.items()}
    # one seeded draw: the rows of every batch are the first rows of it, a prompt of 2P the first row's
    vocab = min([target.vocab_size, len(target.tokenizer)] + [d.vocab_size for d in drafts.values()])
    generator = torch.Generator().manual_seed(config.seed)
    pool = torch.randint(0, vocab, (max(rows), 2 * prompt), generator=generator).to(device)

    prefills, failures = [], []
    shares = pass_shares(args.reps, args.passes)
    reps: dict[tuple, list[float]] = {}  # (model, rows, width, kv) -> its repetitions, pass after pass
    failed: set[tuple[int, int]] = set()
    with torch.inference_mode():
        for index, share in enumerate(shares):
            for batch in rows:
                ids = pool[:batch, :prompt].contiguous()
                mask = torch.ones_like(ids)
                # a real batch is ragged (left padding, or a joined cache's): every row after the first starts with
                # padding, so the steps take the padded attention path the run's steps take, not the unpadded fast one
                mask[1:, :RAGGED_PADDING] = 0
                for model in loading.compiled_models(config, target, drafts).values():  # graphs compiled before timing
                    model.precompile(ids, mask)
                quiet_heap()  # as a run's timed batches: the collector's oldest generation holds none of this
                prefilled = index > 0  # the batch's prefills, once per rows (they do not depend on the cache)
                for kv in kvs:
                    if (batch, kv) in failed:
                        continue
                    console.print(f"pass {index + 1}, rows {batch}, cache {kv} tokens: timing widths {widths}"
                                  + (f" and drafts {', '.join(models)}" if models else ""))
                    try:
                        probe = measure_costs(target.model, models, ids, mask, widths, clock, reps=share,
                                              tree_widths=tree_widths, sampling=sampling, context=kv - prompt,
                                              target_vocab_size=target.vocab_size, prefills=not prefilled)
                    except RUNTIME_ERRORS as error:  # e.g. CUDA out of memory at many rows: the others go on
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                        failed.add((batch, kv))
                        failures.append({"rows": batch, "kv": kv, "error": f"{type(error).__name__}: {one_line(error)}"})
                        console.print(f"[red]rows {batch}, cache {kv}: {failures[-1]['error']}; the others go on[/red]")
                        continue
                    prefilled = True
                    measured_steps, measured_prefills = from_probe(probe, batch)
                    for point in measured_steps:
                        reps.setdefault((point["model"], point["rows"], point["width"], point["kv"]),
                                        []).extend(point["reps_s"])
                    prefills += measured_prefills
        steps = [step_point(*key, times) for key, times in reps.items()]
        # a prompt of 2P: the prefill's line in rows x tokens has two widths at one row
        long_ids = pool[:1].contiguous()
        prefills += prefill_points(target.model, models, long_ids, torch.ones_like(long_ids), clock, first_row=False)

    meta = {**environment(device), "dtype": target.dtype, "quantization": target.quantization,
            "dtypes": {name: m.dtype for name, m in _named(target, drafts).items()},
            "quantizations": {name: m.quantization for name, m in _named(target, drafts).items()},
            "kernels": {name: m.kernels for name, m in _named(target, drafts).items()},
            "attention": {name: m.attn_implementation for name, m in _named(target, drafts).items()},
            "engine": HOME_ENGINE, "compile": bool(config.engine.compile), "compile_mode": config.engine.compile_mode,
            "compile_backend": config.engine.compile_backend,
            "models": _model_ids(config, drafts), "target_model": config.target.model,
            "draft_labels": list(drafts), "config": str(args.config), "config_name": config.name,
            "seed": config.seed, "sampling": dataclasses.asdict(sampling),
            "prompt_tokens": prompt, "ragged_padding": RAGGED_PADDING, "rows": rows, "kv": kvs, "widths": widths,
            "tree_widths": sorted(tree_widths),
            "reps": args.reps, "passes": len(shares), "prefill_reps": 2,
            "command": command}
    if rows_note:
        meta["notes"] = [rows_note]
    if failures:
        meta["failures"] = failures
    meta["elapsed_s"] = time.perf_counter() - started
    profile = Profile(meta=meta, steps=steps, prefills=prefills)
    try:
        profile.save(out)
    except OSError as error:
        raise UserError(f"--out {out}: cannot write the profile there ({error.strerror or error}); give a writable "
                        "file path") from None
    return profile, out


def pass_shares(reps: int, passes: int) -> list[int]:
    """Each pass's repetitions: reps over at most `passes` passes, the first ones taking the remainder (9 over 3:
    3, 3, 3; 5 over 3: 2, 2, 1; 2 over 3: 1, 1)."""
    passes = min(passes, reps)
    return [reps // passes + (1 if index < reps % passes else 0) for index in range(passes)]


def writable(out: Path) -> None:
    """Refuse an --out that cannot be written before anything loads (its folder is made where missing)."""
    from utils import UserError

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"--out {out}: cannot make its folder ({error.strerror or error}); give a writable file "
                        "path") from None
    if out.is_dir() or not os.access(out.parent, os.W_OK):
        raise UserError(f"--out {out}: {'a folder' if out.is_dir() else 'its folder is not writable'}; give a "
                        "writable file path")


def _named(target, drafts) -> dict:
    """The loaded models by their name in the profile (eval/costs.py TARGET, draft_model)."""
    from eval.costs import TARGET, draft_model

    return {TARGET: target, **{draft_model(label): d for label, d in drafts.items()}}


def _model_ids(config, drafts) -> dict:
    """The profile's model names -> the config's model strings (a draft by its label)."""
    from eval.costs import TARGET, draft_model

    by_label = {d.name: d.model for d in config.draft}
    return {TARGET: config.target.model, **{draft_model(label): by_label[label] for label in drafts}}


def print_profile(profile, out: Path, console) -> None:
    """Per rows and cache: the target's 1-token step, each verification width, each draft's step; the prefills (ms)."""
    from rich.table import Table

    from eval.costs import TARGET, draft_model

    widths = [w for w in profile.widths_measured(TARGET) if w > 1]
    drafts = profile.drafts()
    table = Table(title=f"cost profile, ms ({profile.meta.get('device_name')}, {profile.meta.get('dtype')}"
                        f"{', compiled' if profile.meta.get('compile') else ''})")
    for header in ["rows", "kv", "target 1", *[f"verify {w}" for w in widths], *[f"draft {d}" for d in drafts]]:
        table.add_column(header, justify="right")
    at = {(p["model"], p["rows"], p["width"], p["kv"]): p["s"] for p in profile.steps}
    for batch, kv in sorted({(p["rows"], p["kv"]) for p in profile.steps}):
        cells = [at.get((TARGET, batch, w, kv)) for w in [1, *widths]]
        cells += [at.get((draft_model(d), batch, 1, kv)) for d in drafts]
        table.add_row(str(batch), str(kv), *["-" if s is None else f"{1000 * s:.2f}" for s in cells])
    console.print(table)
    prefills = Table(title="prefills, ms")
    for header in ["model", "rows", "tokens", "ms"]:
        prefills.add_column(header, justify="right" if header != "model" else "left")
    for p in sorted(profile.prefills, key=lambda p: (p["model"] != TARGET, p["model"], p["rows"], p["tokens"])):
        prefills.add_row(p["model"], str(p["rows"]), str(p["tokens"]), f"{1000 * p['s']:.2f}")
    console.print(prefills)
    for failure in profile.meta.get("failures", []):
        console.print(f"[red]not measured: rows {failure['rows']}, cache {failure['kv']}: {failure['error']}[/red]")
    for note in profile.meta.get("notes", []):
        console.print(f"note: {note}")
    console.print(f"profiled in {profile.meta['elapsed_s']:.1f} s; written to {out}")


if __name__ == "__main__":
    sys.exit(main())
