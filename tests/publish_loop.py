"""Test helper process: publish copies of a template SavedModel, over and over, through the real code.

`python tests/publish_loop.py TEMPLATE MODEL_BASE COUNT` publishes COUNT versions (or until killed)
and prints each number it got.

`python tests/publish_loop.py TEMPLATE MODEL_BASE forks`: for each line read on stdin, forks a child (no
interpreter to start: a kill costs milliseconds, not a Python start) that prints `pid PID`, then publishes
until killed, printing each number; once the child has ended, prints `ended`.
"""

import os
import shutil
import sys
from pathlib import Path

from trainserve.training.publish import publish_or_discard, staging_dir


def copy_template(template: Path):
    def prepare(staged: Path) -> None:
        shutil.copytree(template, staged, dirs_exist_ok=True)

    return prepare


def publish(template: Path, model_base: Path, count: int | None) -> None:
    done = 0
    while count is None or done < count:
        version, _ = publish_or_discard(staging_dir(model_base), copy_template(template), {"model_name": "t"}, None)
        print(version, flush=True)
        done += 1


def fork_on_request(template: Path, model_base: Path) -> None:
    for _ in sys.stdin:
        child = os.fork()
        if child == 0:
            print(f"pid {os.getpid()}", flush=True)
            publish(template, model_base, None)
            os._exit(0)
        os.waitpid(child, 0)
        print("ended", flush=True)


if __name__ == "__main__":
    template, model_base, count = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    if count == "forks":
        fork_on_request(template, model_base)
    else:
        publish(template, model_base, int(count))
