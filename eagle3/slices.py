"""Which part of a phase's input a shard gets: contiguous blocks that differ in size by at most one,
the first `total % count` shards one larger. speculators' `generate-offline-data --world-size/--rank`
splits its prepared dataset by the same rule, so a sharded extraction and the pack agree on which
hidden-state files a shard owns."""

from __future__ import annotations

from dataclasses import dataclass


def contiguous(total: int, index: int, count: int) -> range:
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}: the index must be in [0, count)")
    size, extra = divmod(max(total, 0), count)
    start = index * size + min(index, extra)
    return range(start, start + size + (1 if index < extra else 0))


@dataclass(frozen=True)
class Shard:
    phase: str
    index: int
    count: int

    def __post_init__(self):
        contiguous(0, self.index, self.count)  # a bad index fails here, named

    @property
    def label(self) -> str:
        return f"{self.phase} shard {self.index + 1}/{self.count}"

    def take(self, items: list) -> list:
        """This shard's part of `items` (in their order)."""
        return [items[i] for i in contiguous(len(items), self.index, self.count)]
