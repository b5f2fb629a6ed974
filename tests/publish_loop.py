"""Test helper process: publish copies of a template SavedModel, over and over, through the real code.

`python tests/publish_loop.py TEMPLATE MODEL_BASE COUNT` publishes COUNT versions (or until killed)
and prints each number it got.
"""

import shutil
import sys
from pathlib import Path

from trainserve.training.publish import publish_or_discard, staging_dir


def copy_template(template: Path):
    def prepare(staged: Path) -> None:
        shutil.copytree(template, staged, dirs_exist_ok=True)

    return prepare


if __name__ == "__main__":
    template, model_base, count = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    for _ in range(count):
        version, _ = publish_or_discard(staging_dir(model_base), copy_template(template), {"model_name": "t"}, None)
        print(version, flush=True)
