"""`--shard I/N`, one meaning for every command that splits its work between clients: this client takes items
I, I + N, I + 2N, ... of the sequence (batches for eval, captured records for replay, drift and export), so
each item belongs to exactly one shard and the shards' reports merge exactly."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


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


def add_merge_parser(commands, name: str, sharded: str, description: str, func) -> argparse.ArgumentParser:
    """The command `name` that merges the reports of `trainserve <sharded> --shard I/N` clients: REPORTS...
    --output FILE, the same for every command that shards."""
    merge = commands.add_parser(
        name,
        help=f"combine the reports of `trainserve {sharded} --shard I/N` clients into one",
        description=description,
    )
    merge.add_argument("reports", nargs="+", type=Path, help="every shard's JSON report (every shard, once)")
    merge.add_argument("--output", type=Path, required=True, help="write the merged report here")
    merge.set_defaults(func=func)
    return merge
