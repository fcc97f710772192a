"""What the user turns a target wrote for itself (`datagen.self_prompts`) are about, in three shares: turns
with a programming word or a code fence, turns with Chinese, Japanese or Korean script, and turns that begin
"Q:" or "Qwen" (the quiz and self-introduction habits Qwen2.5-Coder-1.5B showed under its default system
prompt, bench/RESULTS.md 2026-12-07). Each share with its 95 % Wilson interval. A keyword check, not a
judge: it says whether steering moved the mix, not whether a turn is a good task.

    python bench/self_prompt_mix.py RUN_DIR/datagen/samples.jsonl self-prompts.jsonl.gz ...

Reads a datagen samples file (its `self-` rows) or the `{"id", "text"}` rows `bench/gpu_e2e.sh` brings back.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
from typing import Iterator

CODE = re.compile(r"\b(code|coding|function|program(?:ming)?|script|python|java(?:script)?|c\+\+|c#|rust|sql|html|css"
                  r"|class|method|bug|debug|algorithm|compile[rd]?|api|regex|array|list|dictionary|loop|variable)\b"
                  r"|\.(?:py|js)\b|```", re.I)
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")
HABITS = ("Q:", "Qwen")


def turns(path: str) -> Iterator[str]:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if "text" in row:
                yield row["text"]
            elif str(row.get("id", "")).startswith("self-"):
                yield row["conversations"][0]["content"]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    centre, spread = k + z * z / 2, z * math.sqrt(k * (n - k) / n + z * z / 4)
    return (centre - spread) / (n + z * z), (centre + spread) / (n + z * z)


def mix(texts: list[str]) -> dict:
    n = len(texts)
    counts = {"code": sum(bool(CODE.search(t)) for t in texts), "cjk": sum(bool(CJK.search(t)) for t in texts),
              "habit": sum(t.lstrip().startswith(HABITS) for t in texts)}
    return {"turns": n, **{k: {"count": c, "share": c / n, "ci95": wilson(c, n)} for k, c in counts.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    for path in args.files:
        texts = list(turns(path))
        if not texts:
            print(f"{path}: no written user turns", file=sys.stderr)
            return 1
        m = mix(texts)
        shown = "; ".join(f"{name} {m[key]['count']} ({m[key]['share']:.0%} [{m[key]['ci95'][0]:.0%}, {m[key]['ci95'][1]:.0%}])"
                          for key, name in (("code", "programming words"), ("cjk", "CJK script"), ("habit", "'Q:'/'Qwen' starts")))
        print(f"{path}: {m['turns']} turns; {shown}")
        print(json.dumps({"file": path, **m}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
