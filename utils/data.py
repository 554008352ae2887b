"""Prompts from a hub dataset or a local file, with presets for GSM8K, HumanEval and MT-Bench."""
from __future__ import annotations

import hashlib
import importlib.util
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from utils import UserError
from utils.config import DatasetConfig


class DataError(UserError):
    pass


PRESETS = {
    # preset: (default hub path, config name, prompt field, reference field)
    "gsm8k": ("openai/gsm8k", "main", "question", "answer"),
    "humaneval": ("openai/openai_humaneval", None, "prompt", "canonical_solution"),
    "humaneval_edit": ("openai/openai_humaneval", None, "prompt", "canonical_solution"),
    "mt_bench": ("HuggingFaceH4/mt_bench_prompts", None, "turns", None),
}
INSTRUCTIONS = {
    "gsm8k": "Solve the problem step by step, then give the final answer after '####'.\n\n",
    "humaneval": "Complete the following Python function. Answer with code only.\n\n",
    "humaneval_edit": "Complete the following Python function. Answer with code only.\n\n",
}
# a later turn's text may quote the answer to the turn before it: this marker is replaced by that answer
PREVIOUS_ANSWER = "<<previous answer>>"
# humaneval_edit: a HumanEval task as an edit loop, a stand-in for agentic traffic whose context repeats and grows
EDIT_FIX = ("This test fails on your code:\n\n{test}\n\nHere is your code:\n\n" + PREVIOUS_ANSWER +
            "\n\nFix the function. Answer with the whole corrected code only.")
EDIT_HINTS = ("Add type hints to every function of the code below, and a docstring where one is missing. Answer with "
              "the whole code only.\n\n" + PREVIOUS_ANSWER)


def edit_loop_turns(row: dict, prompt: str) -> list[str]:
    """humaneval_edit's three turns of a HumanEval task: write the function; "this test fails" with the first assert of
    its tests (whether or not the answer fails it: the point is the quoted, edited code) and the previous answer quoted;
    then "add type hints" with the fixed code quoted."""
    return [prompt, EDIT_FIX.format(test=first_test(str(row.get("test") or ""), row.get("entry_point") or "f")),
            EDIT_HINTS]


def first_test(code: str, entry_point: str) -> str:
    """The first assert of HumanEval's check() that calls the candidate, whole (a multi-line one too), the candidate
    named by its entry point; a generic line where the tests cannot be parsed or have none (HumanEval's `assert True`
    debugging lines are passed over)."""
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Assert) and any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "candidate"
                                                for n in ast.walk(node.test)):
            text = ast.get_source_segment(code, node)
            return re.sub(r"\bcandidate\(", f"{entry_point}(", text)
    return f"assert {entry_point}'s own tests pass"
REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass
class Prompt:
    sample_id: int
    text: str  # after the chat template
    token_ids: list[int]
    reference: str | None = None
    truncated: bool = False
    group: str | None = None  # dataset.group_by's value
    conversation: int | None = None  # a conversation's row (dataset.turns): the sample_id of its first turn
    turn: int | None = None  # 1, 2, ... within it


@dataclass
class Conversation:
    """A row run as a conversation (dataset.turns): its user turns, asked one after another."""
    sample_id: int  # its first turn's prompt
    turns: list[str]
    group: str | None = None
    answers: list[str] = field(default_factory=list)  # the target's greedy answers to turns 1 .. n - 1


@dataclass
class PromptSet:
    prompts: list[Prompt]
    skipped_too_long: int = 0
    skipped_empty: int = 0  # rows whose prompt is missing, empty or whitespace only (or has no tokens)
    truncated: int = 0
    source: str = ""
    fields: list[str] = field(default_factory=list)
    field_name: str = ""  # the column the prompts came from
    guessed_field: bool = False  # no prompt_field and no preset: guessed from common names
    notes: list[str] = field(default_factory=list)  # for the report's notes: what ran differs from what was asked
    conversations: list[Conversation] = field(default_factory=list)  # rows of several turns (dataset.turns)
    context: int | None = None  # the most prompt tokens the target's positions leave room for (load_prompts)
    over_context: Counter = field(default_factory=Counter)  # turn (None: a lone prompt) -> prompts longer than context


def resolve_path(path: str) -> tuple[str, str | None]:
    """-> (where, loader): a local file with its datasets loader, or a hub id with None."""
    if path.startswith("pkg://"):
        package, _, inner = path.removeprefix("pkg://").partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise DataError(f"dataset.path: package '{package}' is not installed (pip install -r requirements.txt)")
        path = str(Path(list(spec.submodule_search_locations)[0]) / inner)
    file = Path(path).expanduser()
    if not file.is_absolute() and not file.exists() and (REPO_ROOT / file).exists():
        file = REPO_ROOT / file  # a shipped config's configs/data/... file, run from another folder
    suffixes = [s for s in file.suffixes if s != ".gz"]
    local_like = file.exists() or path.startswith((".", "/", "~")) or (suffixes and suffixes[-1] in LOCAL_FORMATS)
    if not local_like:
        return path, None
    if not file.is_file():
        raise DataError(f"dataset.path: file {path} does not exist")
    loader = LOCAL_FORMATS.get(suffixes[-1] if suffixes else "")
    if loader is None:
        raise DataError(f"dataset.path: {path} has an unknown format; use .json, .jsonl, .parquet or .csv (optionally .gz)")
    return str(file), loader


def load_rows(cfg: DatasetConfig):
    where, loader = resolve_path(cfg.path)
    if loader == "json":  # read here: the datasets package is not needed for a local JSON file
        return _json_rows(where), where
    try:
        import datasets
    except ImportError:
        raise DataError(f"dataset.path: reading {cfg.path} needs the datasets package, which is not installed; "
                        "pip install datasets, or give a local .jsonl file") from None

    datasets.disable_progress_bars()
    try:
        if loader:
            return datasets.load_dataset(loader, data_files=where, split="train"), where
        return datasets.load_dataset(where, cfg.name, split=cfg.split), f"hub:{where}"
    except (FileNotFoundError, ConnectionError, OSError, ValueError) as error:
        text = " ".join(str(error).split())[:200]
        if loader is None:
            raise DataError(f"dataset.path: cannot load '{cfg.path}' from the HuggingFace hub (unreachable or unknown "
                            f"here: {text}); point dataset.path at a local .jsonl/.parquet/.csv file") from None
        raise DataError(f"dataset.path: cannot read {where}: {text}") from None


class Rows(list):
    """A local file's records as dicts, with the part of a datasets.Dataset that load_prompts uses; a field a record
    lacks is None, as datasets fills it."""

    def __init__(self, records: list[dict]):
        self.column_names = list(dict.fromkeys(key for record in records for key in record))
        super().__init__({name: record.get(name) for name in self.column_names} for record in records)

    def select(self, indices) -> Rows:
        return Rows([self[i] for i in indices])


def _json_rows(where: str) -> Rows:
    """A .json/.jsonl file (optionally .gz): JSON Lines of objects or a list of objects."""
    import gzip
    import json

    try:
        with (gzip.open if where.endswith(".gz") else open)(where, "rt", encoding="utf-8") as handle:
            text = handle.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"dataset.path: cannot read {where}: {' '.join(str(error).split())[:200]}") from None
    if isinstance(data, dict):  # a file of one JSON line
        data = [data]
    if not isinstance(data, list) or not all(isinstance(record, dict) for record in data):
        raise DataError(f"dataset.path: {where} holds no records; give JSON Lines of objects or a list of objects")
    return Rows(data)


# column names that hold a prompt in common datasets, for a file given without prompt_field
PROMPT_FIELD_NAMES = ("prompt", "question", "instruction", "input", "text", "turns")


def prompt_field(cfg: DatasetConfig, fields: list[str]) -> tuple[str, bool]:
    """-> (the prompt column, whether it was guessed). Guess only when exactly one common name fits."""
    if cfg.prompt_field or cfg.preset != "none":
        name = cfg.prompt_field or PRESETS[cfg.preset][2]
        if name not in fields:
            raise DataError(f"dataset.prompt_field: '{name}' is not a field of {cfg.path}; fields: {', '.join(fields)}")
        return name, False
    fits = [name for name in PROMPT_FIELD_NAMES if name in fields]
    if len(fits) == 1:
        return fits[0], True
    which = f"several fit ({', '.join(fits)})" if fits else f"none of {', '.join(PROMPT_FIELD_NAMES)} is one"
    raise DataError(f"dataset.prompt_field: not given and {which}; set dataset.prompt_field to one of the fields: "
                    f"{', '.join(fields)}")


def turns_of(value, limit: int | None = None, left_out: Counter | None = None, where: str = "the prompt field"
             ) -> list[str]:
    """A prompt field's user turns, at most `limit`: a text is one; a list of texts (MT-Bench's turns) each; a messages
    list ({role, content} objects) its user messages' contents (its assistant messages are not used: a conversation's
    answers are the target's own). An entry passed over on the way (empty or whitespace only, null, a message without
    content or not the user's) is counted in `left_out` by why; one that is not text (a number, a list, a bool) is
    refused, naming `where`: made a string, it would ask another question than the file's."""
    if value is None:
        return []
    entries = value if isinstance(value, list) else [value]
    turns = []
    for position, entry in enumerate(entries):
        if limit is not None and len(turns) >= limit:
            break
        why, text = None, entry
        if isinstance(entry, dict):
            role, text = entry.get("role") or "user", entry.get("content")
            why = role if role != "user" else "no content" if text is None else None
        elif text is None:
            why = "null"
        if why is None and not isinstance(text, str):
            at = f"{where}[{position}]" if isinstance(value, list) else where
            raise DataError(f"dataset: {at}: {text!r} ({type(text).__name__}) is not text; give each turn as a string "
                            "(or a {role, content} message whose content is a string)")
        why = why or (None if text.strip() else "empty")
        if why is None:
            turns.append(text)
        elif left_out is not None:
            left_out[why] += 1
    return turns


def left_out_note(left_out: Counter, field_name: str) -> str:
    """The report's note on the entries turns_of passed over in the rows run, by why."""
    named = {"empty": ("empty or whitespace only",) * 2, "null": ("null",) * 2,
             "no content": ("user message without content", "user messages without content")}
    order = sorted(left_out, key=lambda why: (list(named).index(why) if why in named else 3 + (why == "assistant")))
    parts = [f"{left_out[why]} {named.get(why, (f'{why} message', f'{why} messages'))[left_out[why] != 1]}"
             + (" (a conversation's answers are the target's own)" if why == "assistant" else "") for why in order]
    total = sum(left_out.values())
    return (f"dataset: {total} {'entry' if total == 1 else 'entries'} of '{field_name}' in the rows run "
            f"{'was' if total == 1 else 'were'} not asked as turns: {', '.join(parts)}")


def row_turns(row: dict, cfg: DatasetConfig, field_name: str, left_out: Counter | None = None, where: str = ""
              ) -> list[str]:
    """A row's user turns, dataset.turns of them (turns_of its prompt field; humaneval_edit: the edit loop of its
    first, edit_loop_turns). Empty where the row has none: a missing (null) field, an empty list, or text that is empty
    or whitespace only (load_prompts skips such a row and counts it as skipped_empty)."""
    limit, where = None if cfg.turns == "all" else cfg.turns, where or f"'{field_name}'"
    if cfg.preset == "humaneval_edit":
        turns = turns_of(row[field_name], 1, left_out, where)
        return edit_loop_turns(row, turns[0])[:limit] if turns else []
    return turns_of(row[field_name], limit, left_out, where)


def conversation_text(tokenizer, cfg: DatasetConfig, turns: list[str], answers: list[str]) -> str:
    """The prompt of turn len(answers) + 1: the chat template over the earlier turns with their answers, and the
    turn itself (the preset's instruction before the first turn only; a turn that holds PREVIOUS_ANSWER quotes the
    answer to the turn before it there); without a template, the texts one after another, separated by blank lines."""
    asked = [INSTRUCTIONS.get(cfg.preset, "") + turns[0]] + [
        text.replace(PREVIOUS_ANSWER, answers[k]) for k, text in enumerate(turns[1:len(answers) + 1])]
    return chat_text(tokenizer, cfg, asked, answers)


def chat_text(tokenizer, cfg: DatasetConfig, asked: list[str], answers: list[str]) -> str:
    """The user turns `asked`, each but the last followed by its answer, through the target's chat template (the
    config's system prompt first); without a template, the texts one after another, blank lines between."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if cfg.chat_template is False or (cfg.chat_template == "auto" and not has_template):
        return "\n\n".join(part for pair in zip(asked, answers + [None]) for part in pair if part is not None)
    if not has_template:
        raise DataError("dataset.chat_template: true but the target's tokenizer has no chat template; set it to auto or false")
    messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    for question, answer in zip(asked, answers + [None]):
        messages.append({"role": "user", "content": question})
        if answer is not None:
            messages.append({"role": "assistant", "content": answer})
    extra = {} if cfg.enable_thinking is None else {"enable_thinking": cfg.enable_thinking}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)


def tokenized(tokenizer, text: str, cfg: DatasetConfig, context: int | None = None
              ) -> tuple[list[int] | None, bool, bool]:
    """(token ids, truncated, over the target's context) of a prompt's text after max_prompt_tokens or `context` (the
    prompt tokens the target's positions leave room for), whichever is less: its last tokens kept, or None where
    prompt_overflow: skip drops it. Over the context: that limit is the context's, and the text went past it."""
    ids = tokenizer(text, add_special_tokens=not _has_bos_in_template(tokenizer, text))["input_ids"]
    limit = min((n for n in (cfg.max_prompt_tokens, context) if n is not None), default=None)
    if limit is None or len(ids) <= limit:
        return ids, False, False
    over = limit == context
    if cfg.prompt_overflow == "skip":
        return None, False, over
    return ids[-limit:], True, over  # keep the end, where the question is asked


def context_note(prompt_set: PromptSet, cfg: DatasetConfig) -> str | None:
    """The report's note on the prompts longer than the target's context (PromptSet.over_context), per turn."""
    if not prompt_set.over_context:
        return None
    count = sum(prompt_set.over_context.values())
    turns = ", ".join(f"turn {turn}: {n}" for turn, n in sorted(prompt_set.over_context.items()) if turn is not None)
    done = ("skipped (a conversation ends at its first turn skipped)" if cfg.prompt_overflow == "skip" else
            f"truncated to their last {prompt_set.context} tokens")
    return (f"dataset: {count} prompt{'s' if count != 1 else ''}{f' ({turns})' if turns else ''} longer than the "
            f"target's context less generation.max_new_tokens ({prompt_set.context} tokens) {done} "
            f"(dataset.prompt_overflow: {cfg.prompt_overflow})")


def prompts_digest(prompt_set: PromptSet) -> str:
    """A fingerprint of the prompts as they run (sample ids and token ids): a conversation's later turns hold the
    target's answers, which another process, device or kernel could write otherwise."""
    digest = hashlib.sha256()
    for p in sorted(prompt_set.prompts, key=lambda p: p.sample_id):
        digest.update(f"{p.sample_id}:{','.join(map(str, p.token_ids))};".encode())
    return digest.hexdigest()[:16]


def turn_group(cfg: DatasetConfig, row_group: str | None, turn: int) -> str | None:
    return f"turn {turn}" if cfg.group_by == "turn" and cfg.turns != 1 else row_group


def expand_conversations(prompt_set: PromptSet, cfg: DatasetConfig, tokenizer, answer) -> PromptSet:
    """Every conversation's later turns as prompts, after the first turns: turn k's prompt carries the answers to
    turns 1 .. k - 1, each `answer(token_ids) -> text` of the prompt before it (the target's greedy output, once per
    conversation, so every method sees the same conversation). Their sample_ids follow the rows' (row + k - 1 times
    the rows' span). A turn whose prompt is dropped (prompt_overflow: skip) ends its conversation, counted as
    skipped_too_long."""
    if not prompt_set.conversations:
        return prompt_set
    span = max(p.sample_id for p in prompt_set.prompts) + 1
    by_id = {p.sample_id: p for p in prompt_set.prompts}
    last = {c.sample_id: by_id[c.sample_id] for c in prompt_set.conversations}
    most = max(len(c.turns) for c in prompt_set.conversations)
    for turn in range(2, most + 1):
        for c in prompt_set.conversations:
            if len(c.turns) < turn or c.sample_id not in last:
                continue
            c.answers.append(answer(last[c.sample_id].token_ids))
            text = conversation_text(tokenizer, cfg, c.turns, c.answers)
            ids, truncated, over = tokenized(tokenizer, text, cfg, prompt_set.context)
            if over:
                prompt_set.over_context[turn] += 1
            if ids is None:
                prompt_set.skipped_too_long += 1
                del last[c.sample_id]
                continue
            prompt_set.truncated += truncated
            prompt = Prompt(c.sample_id + (turn - 1) * span, text, ids, None, truncated,
                            turn_group(cfg, c.group, turn), c.sample_id, turn)
            prompt_set.prompts.append(prompt)
            last[c.sample_id] = prompt
    reached = defaultdict(int)  # conversation -> its last turn that became a prompt
    for p in prompt_set.prompts:
        if p.conversation is not None:
            reached[p.conversation] = max(reached[p.conversation], p.turn)
    counts = sorted({reached[c.sample_id] for c in prompt_set.conversations})
    prompt_set.notes.append(
        f"dataset: {len(prompt_set.conversations)} conversations of {'/'.join(map(str, counts))} turns "
        f"(dataset.turns: {cfg.turns}): turn k's prompt holds the earlier turns and the target's greedy answers to "
        f"them (at most generation.max_new_tokens each), generated once before timing with the baseline's step, the "
        f"same for every method and temperature")
    return prompt_set


def reference_of(row: dict, cfg: DatasetConfig) -> str | None:
    if cfg.preset == "none" or PRESETS[cfg.preset][3] is None:
        return None
    return row.get(PRESETS[cfg.preset][3])


def apply_chat_template(tokenizer, text: str, cfg: DatasetConfig) -> str:
    return chat_text(tokenizer, cfg, [text], [])


def load_prompts(cfg: DatasetConfig, tokenizer, context: int | None = None) -> PromptSet:
    """The rows' prompts (a conversation's first turns; expand_conversations adds its later ones). context: the most
    prompt tokens the target's positions leave room for (its max_position_embeddings less generation.max_new_tokens;
    None: no limit known): a longer prompt, of any turn, is truncated or dropped as by max_prompt_tokens."""
    rows, source = load_rows(cfg)
    fields = list(rows.column_names)
    field_name, guessed = prompt_field(cfg, fields)
    if cfg.group_by is not None and cfg.group_by not in fields and not (cfg.group_by == "turn" and cfg.turns != 1):
        also = "; per turn of a conversation needs dataset.turns: 2 or all" if cfg.group_by == "turn" else ""
        raise DataError(f"dataset.group_by: '{cfg.group_by}' is not a field of {cfg.path}; fields: {', '.join(fields)}"
                        + also)
    available = len(rows)
    row_ids = range(available)  # each kept row's place in the file: its prompt's sample_id
    if cfg.per_group is not None:  # group_by is a field of the file (the config and the check above say so)
        taken, keep = defaultdict(int), []
        for index, value in enumerate(row[cfg.group_by] for row in rows):
            taken[value] += 1
            if taken[value] <= cfg.per_group:
                keep.append(index)
        rows, row_ids = rows.select(keep), keep
        available = len(rows)
    if cfg.num_samples is not None:
        rows = rows.select(range(min(cfg.num_samples, available)))
    result = PromptSet([], source=source, fields=fields, field_name=field_name, guessed_field=guessed, context=context)
    left_out = Counter()  # the entries of the rows run that turns_of passed over, by why
    for index, row in zip(row_ids, rows):
        passed = Counter()
        turns = row_turns(row, cfg, field_name, passed, f"row {index} of {cfg.path}, '{field_name}'")
        if not turns:  # nothing to ask: skipped, and counted (the report's notes say how many)
            result.skipped_empty += 1
            continue
        text = apply_chat_template(tokenizer, INSTRUCTIONS.get(cfg.preset, "") + turns[0], cfg)
        ids, truncated, over = tokenized(tokenizer, text, cfg, context)
        if over:
            result.over_context[1 if cfg.turns != 1 else None] += 1
        if ids is None:
            result.skipped_too_long += 1
            continue
        result.truncated += truncated
        if not ids:  # text the tokenizer makes nothing of is as empty as no text
            result.skipped_empty += 1
            continue
        left_out.update(passed)
        group = None if cfg.group_by is None or cfg.group_by not in fields else str(row[cfg.group_by])
        if len(turns) > 1:
            result.conversations.append(Conversation(index, turns, group))
        talk = cfg.turns != 1  # every row is a conversation, of one turn or more
        result.prompts.append(Prompt(index, text, ids, reference_of(row, cfg), truncated, turn_group(cfg, group, 1),
                                     index if talk else None, 1 if talk else None))
    if left_out:
        result.notes.append(left_out_note(left_out, field_name))
    if not result.prompts:
        reasons, fixes = [], []
        if result.skipped_empty:
            reasons.append(f"{result.skipped_empty} of {len(rows)} rows have an empty or whitespace-only "
                           f"'{field_name}'")
            fixes.append("point dataset.prompt_field at the field that holds the prompts, or fill it in")
        if result.skipped_too_long:
            limit = min(n for n in (cfg.max_prompt_tokens, context) if n is not None)
            reasons.append(f"{result.skipped_too_long} longer than {limit} tokens (" + (
                f"max_prompt_tokens={cfg.max_prompt_tokens}" if limit != context else
                "the target's context less generation.max_new_tokens") + ")")
            fixes.append("raise dataset.max_prompt_tokens or use prompt_overflow: truncate" if limit != context else
                         "use prompt_overflow: truncate, lower generation.max_new_tokens or shorten the prompts")
        raise DataError(f"dataset: no prompts left from {cfg.path} ({', '.join(reasons) or 'no rows'}); "
                        f"{'; or '.join(fixes) or 'give a file with at least one row'}")
    if cfg.num_samples is not None and cfg.num_samples > available:  # fewer prompts than asked: say so
        where = "the file" if not source.startswith("hub:") else f"split {cfg.split}"
        where = f"dataset.per_group {cfg.per_group} of {where}" if cfg.per_group is not None else where
        result.notes.append(f"dataset: num_samples {cfg.num_samples} asked for, {where} has {available} rows: "
                            f"{len(result.prompts)} prompts run")
    return result


def _has_bos_in_template(tokenizer, text: str) -> bool:
    bos = getattr(tokenizer, "bos_token", None)
    return bool(bos) and text.startswith(bos)


_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def extract_gsm8k_answer(text: str) -> str | None:
    """The number after the last '####', else the last number in the text; commas and trailing dots dropped."""
    if text is None:
        return None
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    numbers = _NUMBER.findall(tail if "####" in text else text)
    if not numbers:
        return None
    value = (numbers[0] if "####" in text else numbers[-1]).replace(",", "").rstrip(".")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value
