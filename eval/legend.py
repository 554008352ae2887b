"""The report legend: what every figure, flag and field of summary.json means (docs/metrics.md's definitions)."""
from decode.methods import ENGINE_TEXTS
from eval.flags import (COST_SPREAD_LIMIT, DRIFT_LIMIT, FLIP_REACH, HOST_BOUND_BUSY, HOST_BOUND_EXCESS,
                        HOST_BOUND_MIN_C, NUMERICS_DRIFT)
from eval.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, MIN_PROMPTS

LEGEND = {
    "status": "ok: every planned batch measured; partial: fewer batches than planned (a failure or an interruption): "
              "marked 'partial done/planned' in the tables and hollow in the plots, its ratios pair only the batches "
              "it has, and it takes no part in best; failed / skipped: not measured (the error says why)",
    "batches": "a batch is one (repeat, batch_index) of a point; done: measured, paired: also measured by the "
               "baseline (every ratio uses only these), planned: what the sweep planned (every repeat), prompts: the "
               "distinct prompt batches paired (what an interval rests on; a conversation's turns, with their batches, count "
               "once), cross_process: paired batches whose "
               "baseline another process measured (a resumed run, a restarted worker)",
    "samples": "sequences measured (rows of samples.jsonl)",
    "new_tokens": "N: generated tokens up to and including EOS, no prompt, no padding; counted alike for every method",
    "throughput_tok_s": "sum(N) / sum(batch wall times), a batch's wall time being its slowest row's latency; "
                        "throughput_tok_s_repeats: the same per repeat, throughput_tok_s_std their standard deviation",
    "speedup": "throughput(point) / throughput(baseline) over the batches both finished: same prompts, batch size, "
               "temperature and run (the ratio of total tokens over total wall, not a mean of ratios)",
    "speedup_ci95": f"95% paired bootstrap CI over prompts: resample the prompt batches with replacement (the batches "
                    f"holding one conversation's turns together, dataset.turns: they are not independent), each carrying "
                    f"all its repeats of the point and of the baseline (tokens and wall, measured back to back), "
                    f"recompute the ratio of totals ({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}: a rebuild "
                    "gives the same numbers) and take the expanded percentile interval (Hesterberg 2015: the tails cut "
                    "at Phi(-sqrt(n/(n-1)) t_(0.975, n-1)) instead of 2.5%, since the plain percentile interval covers "
                    "only ~85% of the time at 5 prompts and ~90% at 10). It covers how the ratio varies from prompt to "
                    "prompt, the question being 'on prompts like these'; repeats average each prompt's timing noise and "
                    f"do not narrow it by sqrt(repeats). Fewer than {MIN_PROMPTS} prompt batches: null and flagged "
                    "few_samples. Tables print 'speedup [lo, hi]' (or 'speedup (n=k)' with no interval), plots draw "
                    "error bars",
    "decode_speedup": "the same over decode throughput = sum(N - 1) / sum(batch wall - target prefill - draft prefill), "
                      "the part speculation can speed up; decode_speedup_ci95 likewise; null for methods timed per "
                      "batch only (no prefill time). hybrid prefills its draft model in the first round that drafts "
                      "with it, if any: that prefill is decode time here",
    "latency_s": "per sequence: wall time from its batch's start to its last token, device synchronised; mean, p50, "
                 "p90, p99",
    "tpot_s": "time per output token: latency / N per sequence",
    "ttft_s": "time to first token: the prefill",
    "prefill_share": "(target prefill + draft prefill) / latency, summed over samples: the part speculation cannot "
                     "speed up",
    "draft_time_share": "time spent drafting / latency, summed over samples",
    "block_efficiency": "tau = N / target forwards, the prefill forward and its token included: mean tokens per "
                        "target call (baseline 1.0)",
    "mean_accepted_tokens": "MAT = sum(emitted e_r) / rounds R, the correction or bonus token included: what vLLM and "
                            "SGLang call acceptance length, Spec-Bench's #MAT (baseline 1.0); for a tree the same: its "
                            "accepted path length plus one, per round",
    "tree": "the shape of a round's draft (config speculative.tree): null, a chain of gamma; '3-2-1-1', a static tree "
            "with 3 children at the root, 2 under each of those, ...; 'dynamic-N', EAGLE-2's dynamic tree keeping the "
            "best N nodes; 'auto', the shape the tree policy picks. A tree's round verifies all its nodes in one target "
            "forward and accepts one path from the root. The tables show the tree and nodes/rd columns where a point "
            "has a tree",
    "rounds": "R: speculation rounds (target verification forwards after the prefill), all sequences",
    "acceptance_rate": "sum(accepted a_r) / sum(drafted gamma_r) over all rounds of all sequences; rounds that "
                       "drafted nothing add nothing; null when no round drafted a token. For a tree: accepted path "
                       "length / nodes verified (besides the root), which falls as the tree widens whatever its "
                       "accepted path: compare trees by MAT and acceptance_by_depth_rank",
    "acceptance_by_source": "hybrid: per draft source (lookup, suffix, draft), its accepted tokens / the tokens it "
                            "drafted, pooled over every round of every sequence in which it drafted (a token counts "
                            "as accepted when it lies on the round's accepted path); drafted, accepted and rounds "
                            "beside it; every source the method offers is listed, one never chosen with 0 rounds "
                            "(acceptance null); fixed batches and under load alike",
    "acceptance_by_depth_rank": "p(d, r) = hits / trials per depth d (1: the root's children) and sibling rank r (0: "
                                "the drafter's first choice at its parent): hits = rounds whose accepted path's node at "
                                "depth d has rank r, trials = rounds that reached depth d (accepted the path to d - 1) "
                                "with more than r children there. Unconditional on the siblings before r: the chance "
                                "that the rank-r child is the one accepted once its parent is (Sequoia's positional "
                                "acceptance). A chain has rank 0 only and p(d, 0) = P(draft d accepted | drafts 1..d-1 "
                                "accepted). In summary.json a list per depth: {depth, p, hits, trials}, each list by "
                                "rank; the report prints 'd1: r0 p (trials), r1 ...' per tree point",
    "per_position_acceptance": "P(draft i accepted) = rounds with a_r >= i / rounds that drafted at least i; "
                               "unconditional (not given that draft i-1 was accepted). With a constant draft length "
                               "and no round cut by max_new_tokens it is count_i / rounds. For a tree, i is a depth: "
                               "rounds whose accepted path reached depth i / rounds whose tree did",
    "accepted_histogram": "rounds with a_r = 0, 1, ..., gamma, over the rounds that drafted at least one token",
    "constant_draft_length": "true when the rounds drafted gamma: every round, but for rounds cut by the max_new_tokens "
                             "budget (the engine drafts at most max_new_tokens - generated - 1), and at least one round "
                             "drafted the full gamma: then Leviathan's model at gamma applies; null for a tree",
    "drafted_per_round": "mean drafted tokens per round (a tree: nodes verified besides the root, the tables' nodes/rd); "
                         "zero_draft_rounds: share of rounds that drafted nothing (a plain target step)",
    "alpha": "Leviathan's alpha from the rounds, for every schedule: the alpha with sum_r E[a_r | gamma_r, alpha] = "
             "sum_r a_r over the rounds that drafted, E[a | g, alpha] = alpha (1 - alpha^g) / (1 - alpha); every draft "
             "accepted gives 1, none 0; null when no round drafted a token. Not solved from tau, which counts the "
             "prefill's forward and token and so reads low for short outputs. Null for a tree: Leviathan's model is "
             "of a chain (acceptance_by_depth_rank describes a tree); a chain point some of whose rounds were trees "
             "(hybrid's merged trees) solves it from its chain rounds only",
    "draft_cost_ratio_c": "one draft step / one baseline step, each timed as the run executes it (a draft step: its "
                          "1-token forward and its token's choice; a baseline step: the target's 1-token forward, its "
                          "token's choice, greedy its top-2 gap, and the host read), medians of interleaved repetitions "
                          "measured in the run at this batch size, on the first batch's prompt + max_new_tokens / 2 "
                          "tokens of cache",
    "verify_cost_ratio_v": "one chain verification of gamma+1 tokens (the target forward, the acceptance, the host read, "
                           "the rollback) / one baseline step, measured likewise; for a tree of n nodes besides its "
                           "root, v(n): one (n+1)-token target forward through the tree mask (null for auto, whose n "
                           "varies)",
    "draft_cost_ratio_c_run": "c as the run's records time it: the draft's time per draft forward after its prefill / "
                              "the baseline's decode time per step, over the batches both finished (chains with a "
                              "draft model, our engine); verify_cost_ratio_v_run: the target's time per round after "
                              "the prefill / the same step. Beside c and v they say whether a decode efficiency off 1 "
                              "comes from the probed costs (c, v unlike c_run, v_run) or from the tokens per round",
    "verify_cost_by_nodes": "tree points: v(n) at every node count n measured at the point's batch size (the "
                            "verification of n nodes is an (n+1)-token forward; the run probes the n of each tree it "
                            "sweeps, and 1, 2, 3, 4, 6, 8, 12, 16, 24, 32 for auto); the prediction interpolates "
                            "linearly between them (v(0) = 1) and has none beyond the largest. The report's 'Costs of "
                            "the trees' prints it per batch size",
    "weight_bytes_ratio": "the draft's weight bytes / the target's, as loaded (the tensors each model holds: "
                          "parameters, buffers, oneDNN-packed or bitsandbytes-quantized weights, a tied embedding "
                          "once): what c comes near where decoding is memory bound; the tables' 'bytes' column, "
                          "beside c",
    "draft_busy_share": "CUDA only: the GPU's busy time (its kernels' time, from the profiler) in the draft's 1-token "
                        "forward / that forward's wall time; target_busy_share: the same for the target's; null on a "
                        "CPU",
    "predicted_speedup": "(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + v)); predicted_speedup_v1 uses v = 1 "
                         "(Leviathan et al. 2023, Thm 3.8). Only where the model applies: a constant draft length, a "
                         "draft model, c and v measured; else null and the notes say why. A tree: sum_r E[e_r] / "
                         "sum_r (D_r c + v(n_r)) over the point's rounds, E[e_r] = 1 + the sum over the round's nodes "
                         "of the product of p(depth, rank) (acceptance_by_depth_rank, the point's own) along the "
                         "node's path (Sequoia's expected accepted length; a (depth, rank) never tried counts 0), D_r "
                         "the round's draft forwards (its tree's depth unless the round records draft_forwards), each "
                         "priced as a 1-token draft forward c (0 for a drafter without a model), n_r the nodes the "
                         "round's target forward verified (the batch's widest tree, which a row with a smaller tree or "
                         "none waits for too; older records without it: the row's own); predicted_speedup_v1 uses "
                         "v(n) = 1",
    "efficiency": "measured speedup / predicted speedup: how close the implementation comes to the algorithm's limit; "
                  "decode_efficiency: decode speedup / predicted speedup",
    "predicted_speedup_replay": "the replay of the point's own schedule (eval/replay.py, docs/predict.md): its batches, "
                                "or under a load its requests at their arrivals, as the engine's loop runs them (admit, "
                                "round, evict), each request with its measured prompt length, new tokens and rounds, "
                                "each step priced by the run's cost profile (costs.json: the probes' steps by rows and "
                                "width, and the prefills), beside the baseline replayed the same way; the speedup of "
                                "the replayed schedules, computed as the measured one is. Every method of our engine "
                                "with rounds (draft model, prompt lookup, suffix, schedules, trees, hybrid). A static "
                                "batch's tail, once rows leave, is priced at the smallest probed rows above it where "
                                "fewer were not probed (replay.rows_priced_above). _ci95: 200 replays, each of the prompt "
                                "batches (requests under a load) drawn with replacement and priced by the probes' "
                                "repetitions drawn with replacement: the acceptance's spread over prompts and the "
                                "probes' timing spread. "
                                "predicted_decode_speedup_replay: after the prefills. replay: the replayed figures "
                                "(under a load also TTFT P50, TPOT and E2E P50); replay_missing: what the profile "
                                "lacks where it cannot run. replay_efficiency: speedup / it; replay_decode_efficiency: "
                                "decode speedup / the decode one",
    "exact_match": "greedy only: share of samples whose tokens equal the baseline's on the same prompt and repeat; "
                   "mismatches list where each starts (first_mismatch, a token index) and, where the baseline "
                   "recorded it, baseline_gap: the baseline's top-1 minus top-2 logit at that token (null: the outputs "
                   "differ in length only); null for a synthetic-acceptance point (its output is not the target's)",
    "synthetic_acceptance": "config speculative.synthetic_acceptance: the set alpha of a synthetic point (null: the "
                            "real acceptance). Draft and target run their real forwards (gamma drafts, one verification "
                            "of gamma + 1 tokens), but draft i of a round is accepted iff drafts 1..i-1 were and an "
                            "independent Bernoulli(alpha) draw says yes (drawn on the device from the batch's seeded "
                            "generator: reproducible), whatever the tokens; the round then emits the target's own token "
                            "after the accepted prefix (its argmax, or a draw from p). The output mixes draft and target "
                            "tokens and is not the target's: exact_match is null and no exactness flag applies. What it "
                            "measures is the system's cost at that alpha on any pair (random weights included): its "
                            "speedup against the prediction from its measured alpha, c and v (efficiency) tests the cost "
                            "model. Marked 'synthetic=alpha' in its label, a 'synthetic' column in the tables and "
                            "summary.csv, metrics.synthetic true in summary.json, 'synthetic alpha=' in the plot legends; "
                            "it takes no part in best. The report's 'Synthetic acceptance' table: set alpha, estimated "
                            "alpha [95% CI], speedup [95% CI], predicted [at alpha's CI], c, v, measured / predicted [at the "
                            "speedup's CI]",
    "alpha_ci95": f"synthetic points: 95% bootstrap CI of alpha over prompts: resample the prompts with replacement, "
                  f"each with all its repeats' rounds, solve alpha from the resample's rounds as alpha itself "
                  f"({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}, the expanded percentile interval as "
                  f"speedup_ci95's); a prompt, not a batch, is the unit, since each row draws its own acceptances; "
                  f"fewer than {MIN_PROMPTS} prompts: null ('(n=k)' in the tables). alpha_minus_set: the estimate "
                  "minus the set alpha; alpha_prompts: the prompts behind the interval. predicted_speedup_ci95: the "
                  "prediction at the interval's ends, c and v as measured (their own spread is not in it); efficiency_ci95: "
                  "the speedup's interval over the prediction (the prompts' spread alone)",
    "accuracy": "GSM8K: share of answers (after the last '####', else the last number) equal to the reference; "
                "accuracy_cut: answers cut at max_new_tokens before '####' (of accuracy_graded); when more than half "
                "are cut the notes say the accuracy is not meaningful",
    "flags": f"a figure that cannot be trusted as it is, kept and marked '!' in the tables and plots, the notes say "
             f"why: few_samples: fewer than {MIN_PROMPTS} prompt batches back the ratio, so it has no interval; "
             f"cross_process: some of its batches were paired with a baseline another process measured (a resumed "
             f"run, a restarted worker), not back to back; "
             f"ci_wide: the speedup's CI reaches beyond +-ci_target (config, default 10%) of it (repeats: auto stops "
             f"on this same rule); drift: the same 1-token target forward (timed by the same probe, within each "
             f"process) or the baseline's tok/s on the same batches in different repeats moved by more than "
             f"{DRIFT_LIMIT:.0%} (max / min - 1); cost_unstable: a cost probe this point uses has repetitions spread "
             f"over (max - min) / median > {COST_SPREAD_LIMIT:.0%}, or the workers that ran it measured c or v that far "
             f"apart; cost_implausible: v < 1 or c > 1; "
             f"host_bound: the draft's forward waits on the host (Python dispatching eager kernels one by one) more "
             f"than it computes: its GPU busy share below {HOST_BOUND_BUSY:.0%} where CUDA busy times exist, else c >= "
             f"{HOST_BOUND_EXCESS:g}x the weight bytes ratio and c >= {HOST_BOUND_MIN_C:g}; its speedups then measure "
             f"Python and kernel-launch overhead, not the memory-bound decoding that speculation exploits: the "
             f"compiled engine (engine.compile: true)"
             + "".join(f" or {t.title} (the {t.methods} methods)" for t in ENGINE_TEXTS.values()) +
             f" measure the models (compiled and still below it: the engine's host work around its graphs, seen "
             f"at 43% on an H100 for a 1B pair's draft); "
             f"possible_bug: a greedy output differs from the baseline's "
             f"where rounding cannot flip a token: at its first differing token the baseline's top-1 logit led its "
             f"top-2 by more than {FLIP_REACH:g} x the drift, the target's numerics probe's max |logit diff| (over "
             f"every verify width M the run uses, for a bf16 or quantized target; each logit moves by up to the drift), "
             f"or the outputs differ in length only, or no probe ran; records without the baseline's gaps (older "
             f"runs) flag any mismatch while the drift is at most {NUMERICS_DRIFT:g} (fp32 rounding is ~1e-5). A "
             f"mismatch within reach of the drift is explained in the notes instead; "
             f"int8_batch: an 8-bit target at batch > 1 is not exact by construction (LLM.int8 picks its outlier "
             f"columns over all rows of a batch, so a row's logits depend on its neighbours): greedy mismatches there "
             f"are expected (it replaces possible_bug), unless the point measured every sample equal; "
             f"prediction_off: the measured speedup falls outside the replay's predicted interval (without one, more "
             f"than 5% from it), whatever the measured speedup's own interval; the message names the parts of the "
             f"schedule that ran more than 10% from what the replay priced (the draft's steps as c_run / c, the "
             f"verifications as v_run / v, the prefills; under a load these three as the records time them, in units "
             f"of the baseline's steps: a machine uniformly slower than its probes names none)",
    "group": "dataset.group_by's value, or a conversation's turn ('turn 1', 'turn 2', ...: runs of conversations "
             "give figures per turn besides group_by's; group_field says which); null: the overall run. At batch size 1 a group's figures are exact; at batch "
             "size > 1 rows of different groups share a batch, and a group's batch wall time is its slowest row of "
             "that group in the batch",
    **({"engines": " ".join(t.legend for t in ENGINE_TEXTS.values())} if ENGINE_TEXTS else {}),
    "best": "per comparison (batch size or load point, and temperature): each method's point with the highest "
            "measured speedup among status ok points (flagged ones included and marked), and the gamma predicted "
            "best among the gammas swept: by the replay of each gamma's own schedule where every gamma has one "
            "(alpha_used null), else, for a constant draft length with measured costs, by Leviathan's model from "
            "the best point's alpha, c and v",
}
