"""Conversations (dataset.turns): a row of several turns runs turn by turn, turn k's prompt holding the earlier turns
and the target's own greedy answers to them; every method sees the same conversation."""
import json
import re

import pytest
import yaml

from helpers import assert_one_clean_line, base_config, run_launch, save_tiny_pair, word_tokenizer
from utils.config import DatasetConfig
from utils.data import expand_conversations, load_prompts, turns_of
from utils.io import read_jsonl

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def tokenizer(template=True):
    tok = word_tokenizer()
    if template:
        tok.chat_template = TEMPLATE
    return tok


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"turns": ["w3 w4", "w5 w6", "w7"], "category": "a"},
        {"turns": ["w8 w9 w10"], "category": "b"},  # one turn: a conversation of one
        {"messages": None, "turns": ["w11", "w12"], "category": "a"}]


def test_turns_of_texts_and_messages():
    assert turns_of("w3") == ["w3"]
    assert turns_of(["w3", " ", "w4"]) == ["w3", "w4"]
    assert turns_of([{"role": "system", "content": "be brief"}, {"role": "user", "content": "w3"},
                     {"role": "assistant", "content": "w9"}, {"role": "user", "content": "w4"}]) == ["w3", "w4"]


def test_each_turn_holds_the_earlier_turns_and_their_answers(tmp_path):
    cfg = DatasetConfig(path=str(write_rows(tmp_path / "c.jsonl", ROWS)), prompt_field="turns", turns="all",
                        group_by="turn")
    prompts = load_prompts(cfg, tokenizer())
    assert [p.turn for p in prompts.prompts] == [1, 1, 1] and [len(c.turns) for c in prompts.conversations] == [3, 2]
    asked = []

    def answer(token_ids):  # the "target": says which prompt it answered, by its length
        asked.append(len(token_ids))
        return f"w{40 + len(asked)}"

    expand_conversations(prompts, cfg, tokenizer(), answer)
    by_id = {p.sample_id: p for p in prompts.prompts}
    # rows 0, 1, 2; turn 2 of row 0 is 0 + 3, of row 2 is 2 + 3; turn 3 of row 0 is 0 + 6
    assert sorted(by_id) == [0, 1, 2, 3, 5, 6]
    assert by_id[3].text == "<user> w3 w4 <assistant> w41 <user> w5 w6 <assistant>"
    assert by_id[5].text == "<user> w11 <assistant> w42 <user> w12 <assistant>"
    # turn 3 answers from turn 2's prompt, and carries both answers
    assert by_id[6].text == "<user> w3 w4 <assistant> w41 <user> w5 w6 <assistant> w43 <user> w7 <assistant>"
    assert asked[2] == len(by_id[3].token_ids)
    assert [(by_id[i].conversation, by_id[i].turn, by_id[i].group) for i in (0, 1, 3, 5, 6)] == [
        (0, 1, "turn 1"), (1, 1, "turn 1"), (0, 2, "turn 2"), (2, 2, "turn 2"), (0, 3, "turn 3")]
    assert any("3 conversations" not in n and "conversations of 2/3 turns" in n for n in prompts.notes)


def test_without_a_template_the_turns_follow_each_other(tmp_path):
    cfg = DatasetConfig(path=str(write_rows(tmp_path / "c.jsonl", ROWS[:1])), prompt_field="turns", turns=2,
                        chat_template=False)
    prompts = expand_conversations(load_prompts(cfg, tokenizer(False)), cfg, tokenizer(False), lambda ids: "w44")
    assert [p.text for p in prompts.prompts] == ["w3 w4", "w3 w4\n\nw44\n\nw5 w6"]  # turns: 2 of its 3


def test_turns_1_is_the_first_turn_as_before(tmp_path):
    cfg = DatasetConfig(path=str(write_rows(tmp_path / "c.jsonl", ROWS)), prompt_field="turns", chat_template=False)
    prompts = load_prompts(cfg, tokenizer(False))
    assert [p.text for p in prompts.prompts] == ["w3 w4", "w8 w9 w10", "w11"]
    assert not prompts.conversations and all(p.turn is None for p in prompts.prompts)


def test_per_group_takes_the_first_rows_of_each_group(tmp_path):
    rows = ROWS + [{"turns": ["w13"], "category": "b"}, {"turns": ["w14"], "category": "c"}]
    path = str(write_rows(tmp_path / "c.jsonl", rows))
    cfg = DatasetConfig(path=path, prompt_field="turns", chat_template=False, group_by="category", per_group=1)
    prompts = load_prompts(cfg, tokenizer(False))
    assert [(p.text, p.group) for p in prompts.prompts] == [("w3 w4", "a"), ("w8 w9 w10", "b"), ("w14", "c")]
    assert [p.sample_id for p in prompts.prompts] == [0, 1, 4]  # the rows' places in the file, as without per_group
    with pytest.raises(ValueError, match="per_group takes the first N rows of each dataset.group_by value"):
        DatasetConfig(path=path, prompt_field="turns", per_group=1)
    # with num_samples after it, and as conversations (dataset.turns): the first turns of the rows taken, then theirs
    cfg = DatasetConfig(path=path, prompt_field="turns", chat_template=False, group_by="category", per_group=1,
                        num_samples=2, turns="all")
    prompts = load_prompts(cfg, tokenizer(False))
    assert [(p.text, p.turn) for p in prompts.prompts] == [("w3 w4", 1), ("w8 w9 w10", 1)]
    assert [c.turns for c in prompts.conversations] == [["w3 w4", "w5 w6", "w7"]]


def test_bad_turns_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="turns must be"):
        DatasetConfig(path="x.jsonl", turns=0)


def test_every_method_answers_turn_2_as_the_baseline_does(tmp_path):
    target, draft = save_tiny_pair(tmp_path)
    data = write_rows(tmp_path / "talk.jsonl", [{"turns": [f"w{3 + i} w{20 + i} w{3 + i}", f"w{50 + i} w{3 + i}"]}
                                                 for i in range(4)])
    config = base_config(target, draft, data, methods=["baseline", "speculative", "prompt_lookup"],
                         batch_size=[1, 2], speculative={"gamma": [2]})
    config["dataset"].update(prompt_field="turns", turns=2, group_by="turn")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_launch(["--config", path, "--output-dir", tmp_path / "out"])
    assert result.returncode == 0, result.stderr
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    assert {s["turn"] for s in samples} == {1, 2}
    base = {(s["batch_size"], s["sample_id"]): s for s in samples if s["method"] == "baseline"}
    for s in samples:  # greedy, fp32: every method's every turn is the baseline's
        assert s["output_ids"] == base[(s["batch_size"], s["sample_id"])]["output_ids"]
    tok = word_tokenizer()
    for s in (s for s in samples if s["method"] == "baseline" and s["batch_size"] == 1 and s["turn"] == 2):
        first = base[(1, s["conversation"])]
        row = s["conversation"]
        text = f"w{3 + row} w{20 + row} w{3 + row}\n\n{first['output_text']}\n\nw{50 + row} w{3 + row}"
        assert s["prompt_tokens"] == len(tok(text)["input_ids"])  # the baseline's own turn-1 answer inside
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {r["group"] for r in summary["runs"]} == {None, "turn 1", "turn 2"}


def test_the_prompts_fingerprint_tells_other_answers_apart(tmp_path):
    """A resumed run or a Ray worker rebuilds the later turns from its own answers: the fingerprint kept in
    progress.json (prompts.digest) tells when they came out otherwise, and the run is refused then."""
    from utils.data import prompts_digest

    cfg = DatasetConfig(path=str(write_rows(tmp_path / "c.jsonl", ROWS)), prompt_field="turns", turns=2,
                        chat_template=False)

    def built(answer_text):
        return prompts_digest(expand_conversations(load_prompts(cfg, tokenizer(False)), cfg, tokenizer(False),
                                                   lambda ids: answer_text))

    assert built("w44") == built("w44") != built("w45")


def test_under_load_a_turn_arrives_after_its_previous_answer_plus_the_think_time(tmp_path):
    target, draft = save_tiny_pair(tmp_path)
    data = write_rows(tmp_path / "talk.jsonl", [{"turns": [f"w{3 + i} w{20 + i} w{3 + i}", f"w{50 + i} w{3 + i}"]}
                                                 for i in range(3)])
    config = base_config(target, draft, data, methods=["baseline", "prompt_lookup"], speculative={"gamma": [2]})
    config["dataset"].update(prompt_field="turns", turns=2, group_by="turn")
    config.pop("batch_size", None)
    config["load"] = {"concurrency": [2], "think_s": 0.02}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_launch(["--config", path, "--output-dir", tmp_path / "out"])
    assert result.returncode == 0, result.stderr
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    for method in ("baseline", "prompt_lookup"):
        rows = {s["request"]: s for s in samples if s["method"] == method}
        assert sorted(rows) == list(range(6))  # 3 first turns, then their 3 second turns
        for s in rows.values():
            if s["turn"] == 2:
                before = rows[s["follows"]]
                assert (before["conversation"], before["turn"]) == (s["conversation"], 1)
                assert s["arrival_s"] == pytest.approx(before["finish_s"] + 0.02) and s["think_s"] == 0.02
                assert s["admitted_s"] >= s["arrival_s"]
            else:
                assert s["follows"] is None and s["arrival_s"] == 0.0
    base = {s["request"]: s["output_ids"] for s in samples if s["method"] == "baseline"}
    assert all(s["output_ids"] == base[s["request"]] for s in samples)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for run in summary["serving"]["runs"]:  # per turn under load: 3 requests each, paired with the baseline's
        assert [(g["group"], g["requests"], g["requests_paired"]) for g in run["metrics"]["by_group"]] == \
            [("turn 1", 3, 3), ("turn 2", 3, 3)]
    assert "| prompt_lookup gamma=2 conc=2 greedy | turn 2 | 3 |" in (tmp_path / "out" / "summary.md").read_text()


def test_humaneval_edit_is_a_loop_of_three_turns_each_quoting_the_code_before(tmp_path):
    row = {"task_id": "t/0", "prompt": "def add(a, b):\n", "entry_point": "add", "canonical_solution": "    return a + b\n",
           "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"}
    path = write_rows(tmp_path / "h.jsonl", [row])
    cfg = DatasetConfig(path=str(path), preset="humaneval_edit", turns="all", chat_template=False)
    answers = iter(["CODE1", "CODE2"])
    prompts = expand_conversations(load_prompts(cfg, tokenizer(False)), cfg, tokenizer(False), lambda ids: next(answers))
    first, fix, hints = (p.text for p in sorted(prompts.prompts, key=lambda p: p.turn))
    assert first == "Complete the following Python function. Answer with code only.\n\ndef add(a, b):\n"
    assert fix == (first + "\n\nCODE1\n\nThis test fails on your code:\n\nassert add(1, 2) == 3\n\nHere is your code:"
                   "\n\nCODE1\n\nFix the function. Answer with the whole corrected code only.")
    assert hints.startswith(fix + "\n\nCODE2\n\nAdd type hints") and hints.endswith("the whole code only.\n\nCODE2")
    one = load_prompts(DatasetConfig(path=str(path), preset="humaneval_edit", chat_template=False), tokenizer(False))
    assert [p.text for p in one.prompts] == [first] and not one.conversations  # turns: 1, the task alone


def test_the_edit_loops_failing_test_is_a_whole_assert_on_the_candidate():
    from utils.data import first_test

    # HumanEval's debugging asserts are passed over; a multi-line assert is quoted whole
    code = ("def check(candidate):\n    assert True, 'This prints if this assert fails 1'\n"
            "    assert candidate([\n        1, 2\n    ]) == [2, 1]\n    assert candidate([]) == []\n")
    assert first_test(code, "rev") == "assert rev([\n        1, 2\n    ]) == [2, 1]"
    assert first_test("def check(candidate):\n    pass\n", "rev") == "assert rev's own tests pass"
    assert first_test("not python (", "rev") == "assert rev's own tests pass"


def test_every_turn_left_out_is_counted_in_the_notes(tmp_path):
    """Row 0's 8 entries give 2 turns: an empty text, a null, a system message, a user message without content, an
    assistant message (the answers are the target's own) and one of whitespace are left out, each counted; row 1 has
    none left out; row 2 has no turn at all (a row skipped as empty, counted there, its entries not again)."""
    rows = [{"turns": ["w3", "", None, {"role": "system", "content": "w9"}, {"role": "user"},
                       {"role": "assistant", "content": "w10"}, " \n", {"role": "user", "content": "w4"}]},
            {"turns": ["w5", "w6"]}, {"turns": [None, ""]}]
    cfg = DatasetConfig(path=str(write_rows(tmp_path / "c.jsonl", rows)), prompt_field="turns", turns="all",
                        chat_template=False)
    prompts = load_prompts(cfg, tokenizer(False))
    assert [c.turns for c in prompts.conversations] == [["w3", "w4"], ["w5", "w6"]] and prompts.skipped_empty == 1
    assert ("dataset: 6 entries of 'turns' in the rows run were not asked as turns: 2 empty or whitespace only, 1 null, "
            "1 user message without content, 1 system message, 1 assistant message (a conversation's answers are the "
            "target's own)") in prompts.notes
    # turns: 1 asks the first user turn: an entry passed over on the way to it is counted, those after it are not used
    one = load_prompts(DatasetConfig(path=cfg.path, prompt_field="turns", chat_template=False,
                                     num_samples=1), tokenizer(False))
    assert [p.text for p in one.prompts] == ["w3"] and not any("not asked" in n for n in one.notes)
    rows = [{"turns": [None, {"role": "system", "content": "w9"}, "w3", "", "w4"]}]
    cfg = DatasetConfig(path=str(write_rows(tmp_path / "d.jsonl", rows)), prompt_field="turns", turns=2,
                        chat_template=False)
    prompts = load_prompts(cfg, tokenizer(False))
    assert prompts.conversations[0].turns == ["w3", "w4"]
    assert ("dataset: 3 entries of 'turns' in the rows run were not asked as turns: 1 empty or whitespace only, 1 null, "
            "1 system message") in prompts.notes


@pytest.mark.parametrize("entry, shown", [
    (42, "42 (int)"), (["nested", "list"], "['nested', 'list'] (list)"), (True, "True (bool)"), (2.5, "2.5 (float)"),
    ({"role": "user", "content": 7}, "7 (int)"), ({"role": "user", "content": ["w4"]}, "['w4'] (list)"),
], ids=["number", "nested-list", "bool", "float", "message-number", "message-list"])
def test_a_turn_that_is_not_text_is_refused_naming_its_row(tmp_path, entry, shown):
    from utils.data import DataError

    rows = [{"turns": ["w3", "w4"]}, {"turns": ["w5", entry, "w6"]}]
    cfg = DatasetConfig(path=str(write_rows(tmp_path / "c.jsonl", rows)), prompt_field="turns", turns="all",
                        chat_template=False)
    with pytest.raises(DataError, match=rf"^dataset: row 1 of .*c\.jsonl, 'turns'\[1\]: {re.escape(shown)} is not "
                                        r"text; give each turn as a string"):
        load_prompts(cfg, tokenizer(False))


def test_a_prompt_that_is_not_text_is_refused_in_one_line(tmp_path):
    target, draft = save_tiny_pair(tmp_path)
    data = write_rows(tmp_path / "talk.jsonl", [{"turns": ["w3 w4", "w5"]}, {"turns": 42}])
    config = base_config(target, draft, data, methods=["baseline"], batch_size=[1], warmup=0)
    config["dataset"].update(prompt_field="turns", turns="all")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert_one_clean_line(run_launch(["--config", path, "--output-dir", tmp_path / "out"]),
                          "row 1 of " + str(data) + ", 'turns': 42 (int) is not text")


@pytest.mark.parametrize("overflow, max_prompt_tokens", [("truncate", None), ("skip", None), ("truncate", 4)])
def test_a_turn_longer_than_the_targets_context_is_cut_or_dropped_and_counted(tmp_path, overflow, max_prompt_tokens):
    """Room for 6 prompt tokens. Row 0's turn 2 holds its long answer: 10 tokens; row 1's conversation stays short;
    row 2's first turn is 7 tokens, and its turn 2 longer still. truncate keeps each one's last 6 tokens, skip drops
    it (and the rest of its conversation); each is counted per turn. With max_prompt_tokens 4, under the room, that
    limit cuts them, as before, and none is over the context."""
    from utils.data import context_note

    rows = [{"turns": ["w3 w4", "w5 w6"]}, {"turns": ["w7", "w8"]}, {"turns": ["w10 w11 w12 w13 w14 w15 w16", "w18"]}]
    cfg = DatasetConfig(path=str(write_rows(tmp_path / "c.jsonl", rows)), prompt_field="turns", turns="all",
                        chat_template=False, prompt_overflow=overflow, max_prompt_tokens=max_prompt_tokens)
    tok = tokenizer(False)
    prompts = load_prompts(cfg, tok, context=6)
    long = tuple(tok("w3 w4")["input_ids"])
    prompts = expand_conversations(prompts, cfg, tok, lambda ids: "w41 w42 w43 w44 w45 w46" if tuple(ids) == long
                                   else "w9")
    texts = {(p.conversation, p.turn): tok.decode(p.token_ids) for p in prompts.prompts}
    if max_prompt_tokens == 4:
        assert texts == {(0, 1): "w3 w4", (1, 1): "w7", (2, 1): "w13 w14 w15 w16", (0, 2): "w45 w46 w5 w6",
                         (1, 2): "w7 w9 w8", (2, 2): "w15 w16 w9 w18"}
        assert not prompts.over_context and context_note(prompts, cfg) is None and prompts.truncated == 3
        return
    if overflow == "truncate":
        assert texts == {(0, 1): "w3 w4", (1, 1): "w7", (2, 1): "w11 w12 w13 w14 w15 w16",
                         (0, 2): "w43 w44 w45 w46 w5 w6", (1, 2): "w7 w9 w8", (2, 2): "w13 w14 w15 w16 w9 w18"}
        assert (prompts.over_context, prompts.truncated, prompts.skipped_too_long) == ({1: 1, 2: 2}, 3, 0)
        assert context_note(prompts, cfg) == (
            "dataset: 3 prompts (turn 1: 1, turn 2: 2) longer than the target's context less "
            "generation.max_new_tokens (6 tokens) truncated to their last 6 tokens (dataset.prompt_overflow: truncate)")
    else:
        assert texts == {(0, 1): "w3 w4", (1, 1): "w7", (1, 2): "w7 w9 w8"}
        assert (prompts.over_context, prompts.truncated, prompts.skipped_too_long) == ({1: 1, 2: 1}, 0, 2)
        assert context_note(prompts, cfg) == (
            "dataset: 2 prompts (turn 1: 1, turn 2: 1) longer than the target's context less "
            "generation.max_new_tokens (6 tokens) skipped (a conversation ends at its first turn skipped) "
            "(dataset.prompt_overflow: skip)")


def test_the_room_for_a_prompt_is_the_targets_positions_less_the_new_tokens():
    from types import SimpleNamespace

    from runner.loading import prompt_room
    from tiny_models import tiny_model
    from utils import ConfigError

    target = SimpleNamespace(model=tiny_model("llama", seed=1, layers=1))  # max_position_embeddings 512
    assert prompt_room(SimpleNamespace(generation=SimpleNamespace(max_new_tokens=12)), target) == 500
    with pytest.raises(ConfigError, match="^generation.max_new_tokens: 512 leaves no room for a prompt in the "
                                          "target's context of 512 positions"):
        prompt_room(SimpleNamespace(generation=SimpleNamespace(max_new_tokens=512)), target)


def test_a_later_turn_past_the_targets_context_runs_cut_to_it_and_the_report_says_so(tmp_path):
    """The tiny target has 512 positions; at 4 new tokens a prompt has room for 508. Turn 2 quotes 600 words: it runs
    as its last 508 tokens, and the report's notes count it."""
    target, draft = save_tiny_pair(tmp_path)
    data = write_rows(tmp_path / "talk.jsonl", [{"turns": ["w3 w4", " ".join(f"w{3 + i % 90}" for i in range(600))]}])
    config = base_config(target, draft, data, methods=["baseline"], batch_size=[1], warmup=0,
                         generation={"max_new_tokens": 4})
    config["dataset"].update(prompt_field="turns", turns="all")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_launch(["--config", path, "--output-dir", tmp_path / "out"])
    assert result.returncode == 0, result.stderr[-2000:]
    samples = read_jsonl(tmp_path / "out" / "samples.jsonl")
    assert sorted((s["turn"], s["prompt_tokens"]) for s in samples) == [(1, 2), (2, 508)]
    assert ("dataset: 1 prompt (turn 2: 1) longer than the target's context less generation.max_new_tokens (508 "
            "tokens) truncated to their last 508 tokens") in (tmp_path / "out" / "summary.md").read_text()


def test_an_edit_loops_repeat_drafts_as_its_first_repeat_did(tmp_path):
    """repeats: 2 of HumanEval edit loops: in repeat 1 a task's turn 1 must not draft from the answers to its own
    turns 2 and 3 (which re-emit turn 1's code) that repeat 0 left in the point's suffix cache: every suffix record of
    repeat 1, turn 1 first, has repeat 0's target forwards and accepted tokens."""
    target, draft = save_tiny_pair(tmp_path)
    rows = [{"task_id": f"t/{i}", "prompt": f"w{3 + i} w{20 + i} w{3 + i} w{20 + i}", "entry_point": "f",
             "canonical_solution": "", "test": ""} for i in range(2)]
    config = base_config(target, draft, write_rows(tmp_path / "h.jsonl", rows), methods=["baseline", "suffix"],
                         batch_size=[1], warmup=0, repeats=2, speculative={"gamma": [4]},
                         generation={"max_new_tokens": 16})
    config["dataset"].update(preset="humaneval_edit", turns="all", prompt_field=None)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_launch(["--config", path, "--output-dir", tmp_path / "out"])
    assert result.returncode == 0, result.stderr[-2000:]
    runs = {(s["repeat"], s["turn"], s["conversation"]): (s["target_forwards"], sum(r["accepted"] for r in s["rounds"]))
            for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["method"] == "suffix"}
    assert len(runs) == 12
    assert [runs[(1, turn, c)] for turn in (1, 2, 3) for c in (0, 1)] == \
        [runs[(0, turn, c)] for turn in (1, 2, 3) for c in (0, 1)]
