"""`--shard I/N`, one meaning for every command that splits its work between clients: this client takes items
I, I + N, I + 2N, ... of the sequence (batches for eval, captured records for replay, drift and export), so
each item belongs to exactly one shard and the shards' reports merge exactly."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """`I/N` with 0 <= I < N; the default 0/1 takes everything."""

    index: int = 0
    count: int = 1

    def describe(self) -> str:
        return f"{self.index}/{self.count}"

    def takes(self, number: int) -> bool:
        """Whether item `number` (counted from 0) is this shard's."""
        return number % self.count == self.index


def parse_shard(text: str) -> Shard:
    index, sep, count = text.partition("/")
    try:
        shard = Shard(int(index), int(count))
    except ValueError:
        shard = None
    if not sep or shard is None or not 0 <= shard.index < shard.count:
        raise argparse.ArgumentTypeError(f"{text!r}: expected I/N with 0 <= I < N, e.g. 0/4")
    return shard
