"""Prompt sets for data generation: read, validate and give every row a stable id.

Accepted rows (JSONL, one JSON object per line; blank lines are ignored):
  {"id": "a1", "conversations": [{"role": "user", "content": "..."}, ...]}   (role/content)
  {"id": "a1", "conversations": [{"from": "human", "value": "..."}, ...]}    (ShareGPT from/value)
  {"id": "a1", "messages": [...]}                                             (same, other key)
  {"id": "a1", "prompt": "..."}                                               (one user turn)
`id` may be a string or an integer; without one (nor `uuid`), the id is a hash of the turns, so it
is the same on every read and a resume can recognise the row.

The prompt sent to the target is the conversation up to and including its last user turn; whatever
follows it (the dataset's original answer) is dropped, because the target regenerates it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

ROLE_ALIASES = {
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
    "system": "system",
}
TURN_KEYS = ("conversations", "messages")
MAX_SHOWN = 20


# A chat template's own tokens around a conversation, its system prompt included: at most this many.
TEMPLATE_TOKENS = 256


def tokens_at_most(prompt_bytes: int, answer_tokens: int, cap: int) -> int:
    """The most tokens one request can take: a prompt of n UTF-8 bytes is at most n tokens (a token of a
    byte-level or byte-fallback vocabulary covers one byte or more), the template's, the answer; at most cap."""
    return min(cap, prompt_bytes + TEMPLATE_TOKENS + answer_tokens)


@dataclass(frozen=True)
class Prompt:
    id: str
    line: int
    messages: tuple[dict, ...]  # role/content dicts, ending with a user turn
    category: str | None = None  # the row's `category` (MT-Bench style), for per-category reports


@dataclass
class PromptSet:
    path: Path
    sha256: str                      # of the whole file: what a resume compares
    prompts: list[Prompt]
    problems: list[str] = field(default_factory=list)  # "path:line: message" for each skipped row
    rows: int = 0                    # non-blank lines read

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.prompts]


class PromptError(ValueError):
    """One row is unusable; the message says what to change."""


def _turns(row: dict) -> list:
    for key in TURN_KEYS:
        if key in row:
            turns = row[key]
            if not isinstance(turns, list) or not turns:
                raise PromptError(f"'{key}' must be a non-empty list of turns")
            return turns
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise PromptError("'prompt' must be a non-empty string")
        return [{"role": "user", "content": row["prompt"]}]
    raise PromptError("no turns: give 'conversations' (or 'messages') as a list of {role, content}, or 'prompt'")


def _normalise_turn(turn: object, index: int) -> dict:
    if not isinstance(turn, dict):
        raise PromptError(f"turn {index} must be an object with 'role' and 'content', got {type(turn).__name__}")
    role = turn.get("role", turn.get("from"))
    content = turn.get("content", turn.get("value"))
    if not isinstance(role, str) or role.lower() not in ROLE_ALIASES:
        raise PromptError(f"turn {index}: role {role!r} is not one of user/human, assistant/gpt, system")
    if not isinstance(content, str):
        kind = "missing" if content is None else type(content).__name__
        raise PromptError(f"turn {index}: content must be a string (text only), got {kind}")
    return {"role": ROLE_ALIASES[role.lower()], "content": content}


def _row_id(row: dict, messages: list[dict]) -> str:
    for key in ("id", "uuid"):
        if key in row:
            value = row[key]
            if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value.strip()):
                raise PromptError(f"'{key}' must be a non-empty string or an integer, got {value!r}")
            return str(value)
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return f"sha-{digest[:20]}"


def parse_row(row: object) -> tuple[str, list[dict]]:
    """(id, prompt messages) of one decoded row, or PromptError."""
    if not isinstance(row, dict):
        raise PromptError(f"each line must be a JSON object, got {type(row).__name__}")
    messages = [_normalise_turn(t, i) for i, t in enumerate(_turns(row))]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise PromptError("no user turn; the target needs at least one user message to answer")
    messages = messages[: last_user + 1]
    if not messages[-1]["content"].strip():
        raise PromptError("the last user turn is empty")
    return _row_id(row, messages), messages


def category_of(row: dict) -> str | None:
    value = row.get("category")
    return value.strip() if isinstance(value, str) and value.strip() else None


def load_prompts(path: Path | str, max_samples: int | None = None, skip_invalid: bool = False) -> PromptSet:
    """Read and validate the whole file, then keep the first `max_samples` valid rows.

    Every row is checked (not only the first `max_samples`) so a bad file is reported in one go.
    Unless `skip_invalid`, any problem raises ConfigError listing each one as path:line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: prompt file not found; set datagen.prompts to a JSONL prompt set") from None
    return validate_rows(path, hashlib.sha256(data).hexdigest(), jsonl_rows(data), max_samples, skip_invalid)


def jsonl_rows(data: bytes):
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            yield lineno, json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            yield lineno, PromptError(f"not valid JSON ({e}); each line must be one complete JSON object")


def validate_rows(path: Path, sha256: str, rows_in, max_samples: int | None = None,
                  skip_invalid: bool = False) -> PromptSet:
    """A PromptSet from (line or row number, decoded row or PromptError) pairs: each row checked,
    ids unique; unless `skip_invalid`, any problem raises ConfigError listing each one."""
    prompts: list[Prompt] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    rows = 0
    for lineno, row in rows_in:
        rows += 1
        where = f"{path}:{lineno}"
        try:
            if isinstance(row, PromptError):
                raise row
            pid, messages = parse_row(row)
        except PromptError as e:
            problems.append(f"{where}: {e}")
            continue
        if pid in seen:
            problems.append(f"{where}: id {pid!r} already used on line {seen[pid]}; ids must be unique "
                            "(rows without an id get a hash of their turns, so this may be a repeated prompt)")
            continue
        seen[pid] = lineno
        prompts.append(Prompt(pid, lineno, tuple(messages), category_of(row)))
    if problems and not skip_invalid:
        shown = problems[:MAX_SHOWN]
        more = f"\n... and {len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
        raise ConfigError(f"{path}: {len(problems)} malformed prompt row(s); fix them, or set "
                          "datagen.skip_invalid_prompts: true to skip them:\n" + "\n".join(shown) + more)
    if not prompts:
        raise ConfigError(f"{path}: no usable prompt rows ({rows} non-blank lines); see the accepted formats in "
                          "eagle3/prompts/" + "".join(f"\n{p}" for p in problems[:MAX_SHOWN]))
    if max_samples is not None:
        prompts = prompts[:max_samples]
    return PromptSet(path, sha256, prompts, problems, rows)
