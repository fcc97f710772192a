"""datagen.self_prompts: the target writes prompts of its own (Magpie, Xu et al. 2024).

A chat template rendered up to an open user turn is where the model expects its user to speak: sampled
from there, an instruct model writes a user turn drawn from its own idea of what it is asked, no prompt
set needed. The engine does the rendering (a chat request whose last message is an empty user turn,
`continue_final_message`), so the turn is written against the very template, default system prompt
included, that its answer is then generated under.

Each written prompt is one id of the set (`self-00000`, ...): its row in samples.jsonl holds the user
turn it wrote and the answer, so a resume skips it like any other row. A draw that is cut off, empty,
already written or one of the benchmark's prompts is drawn again with the next seed: the benchmark's
held-out prompts stay unseen (compared as text, whitespace and case aside), and no text is trained on
twice within a run or shard.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from ..config import PipelineConfig
from ..openai_client import InvalidResponse, OpenAIClient
from ..prompts import Prompt, load_prompts
from ..prompts.sets import load_prompt_set

ID_PREFIX = "self-"
CATEGORY = "self-written"


def unwritten_prompts(count: int) -> list[Prompt]:
    """The ids of `count` prompts the target is to write, none written yet."""
    return [Prompt(f"{ID_PREFIX}{i:05d}", 0, ()) for i in range(count)]


def unwritten(prompt: Prompt) -> bool:
    return not prompt.messages


def written_prompts(rows: Iterable[dict]) -> list[Prompt]:
    """The prompts the target wrote, as their rows of samples.jsonl hold them (the user turn; the answer
    dropped), in the rows' order."""
    return [Prompt(str(r["id"]), 0, (dict(r["conversations"][0]),), CATEGORY) for r in rows
            if str(r.get("id", "")).startswith(ID_PREFIX) and r.get("conversations")]


def _key(text: str) -> str:
    return " ".join(text.split()).casefold()


def user_turn_payload(cfg: PipelineConfig, prompt: Prompt, draw: int) -> dict:
    d, sp = cfg.datagen, cfg.datagen.self_prompts
    steer = [{"role": "system", "content": sp.system}] if sp.system else []
    payload = {**d.request_extra, "model": cfg.target.served_name, "messages": [*steer, {"role": "user", "content": ""}],
               "add_generation_prompt": False, "continue_final_message": True,
               "max_tokens": sp.max_tokens, "temperature": sp.temperature, "top_p": sp.top_p}
    if (seed := d.sampling.seed_for(f"{prompt.id}/{draw}")) is not None:
        payload["seed"] = seed
    return payload


def texts_taken(cfg: PipelineConfig, done_rows: list[dict]) -> list[str]:
    """What a written prompt must not repeat: every row of the prompt set (those held out for the
    benchmark too), bench.prompts, and the user turns of the rows already done."""
    sets = [load_prompts(cfg.datagen.prompts, None, skip_invalid=True)]
    bench_prompts = getattr(getattr(cfg, "bench", None), "prompts", None)
    if bench_prompts is not None:  # read as the benchmark reads it: JSON, parquet or a saved dataset too
        sets.append(load_prompt_set(bench_prompts))
    turns = [m for ps in sets for p in ps.prompts for m in p.messages]
    turns += [m for row in done_rows for m in row.get("conversations") or [] if isinstance(m, dict)]
    return [str(m.get("content") or "") for m in turns if m.get("role") == "user"]


class UserTurnWriter:
    """Writes the user turn of an unwritten prompt, never one of `taken` (texts already written, the
    prompt set's and the benchmark's) nor one it wrote before."""

    def __init__(self, cfg: PipelineConfig, taken: Iterable[str]):
        self.cfg = cfg
        self.taken = {_key(t) for t in taken}

    async def write(self, client: OpenAIClient, prompt: Prompt) -> Prompt:
        sp = self.cfg.datagen.self_prompts
        why: list[str] = []
        for draw in range(sp.draws):
            result = await client.chat(user_turn_payload(self.cfg, prompt, draw))
            text = result.content.strip()
            if result.finish_reason != "stop":
                why.append(f"cut off ({result.finish_reason or 'no finish reason'})")
            elif not text:
                why.append("empty")
            elif _key(text) in self.taken:
                why.append("a prompt already there")
            else:
                self.taken.add(_key(text))
                return replace(prompt, messages=({"role": "user", "content": text},), category=CATEGORY)
        raise InvalidResponse(f"no usable user turn in {sp.draws} draws ({'; '.join(why)}); raise "
                              "datagen.self_prompts.max_tokens or draws")
