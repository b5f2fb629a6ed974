"""The label-free estimate on the trained digits model: calibrated on one half of its held-out split, it tracks the
realised accuracy on traffic drawn like the other half (within its stated error) and drops with it on traffic
shifted so that accuracy drops; a day of heavily noised images and a day of inverted ones are flagged (the
confidences moved) in the JSON, the table and the page, with an error widened to cover what was realised, and the
held-out-like day is not. One day of each in one capture: the daily windows show them. Then the same estimate from
the report's calibrations, in a process that cannot import TensorFlow (the eval image)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from captures import capture_name, prediction_log, write_capture
from conftest import record_version
from trainserve.cli import main

DAY = 86_400
T0 = 1_790_000_000 // DAY * DAY
HEAVY = ("tensorflow", "tensorflow_serving", "keras", "sklearn")
# `trainserve ARGS` where the heavy packages cannot be imported (as in the eval image); prints those it imported.
CORE_INSTALL = f"""
import json, sys
sys.modules.update(dict.fromkeys({HEAVY!r}))
from trainserve.cli import main
code = main(sys.argv[1:])
print(json.dumps(sorted({{m.split(".")[0] for m, v in sys.modules.items() if v is not None}} & set({HEAVY!r}))))
sys.exit(code)
"""


@pytest.mark.integration
def test_the_estimate_tracks_realised_accuracy_and_drops_on_shifted_traffic(trained_digits, tmp_path, capsys):
    from trainserve.savedmodel import LoadedModel
    from trainserve.splits import provenance

    version_dir = trained_digits / "models" / "digits" / "1"
    with np.load(trained_digits / "data" / "digits" / "test.npz") as npz:
        images, labels = npz["x_test"], npz["y_test"].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    held_out, traffic = order[: len(order) // 2], order[len(order) // 2 :]
    # The version's record names the first half as its held-out split: the estimate is calibrated on it alone.
    record_version(
        version_dir,
        tmp_path / "data",
        "digits",
        {"images": images[held_out]},
        labels[held_out],
        provenance("test", 0, 0.2),
    )
    noisy = np.random.default_rng(1).integers(-150, 151, images[traffic].shape)
    days = {
        0: images[traffic],  # drawn like the held-out split
        1: np.clip(images[traffic].astype(np.int32) + noisy, 0, 255).astype(np.uint8),  # noise: accuracy drops
        2: 255 - images[traffic],  # inverted: a model trained on dark backgrounds has not seen these
    }
    model = LoadedModel(version_dir)
    records, rows = [], ["request_id,request_row,label"]
    for day, batch in days.items():
        probabilities = model.run("serving_default", {"images": batch}, ["probabilities"])["probabilities"]
        for start in range(0, len(batch), 5):
            request = f"day{day}-{start}"
            records.append(
                prediction_log(
                    "digits",
                    {"images": batch[start : start + 5]},
                    version=1,
                    request_id=request,
                    timestamp_s=T0 + day * DAY + start,
                    outputs={"probabilities": probabilities[start : start + 5]},
                )
            )
            rows += [f"{request},{r},{labels[traffic][start + r]}" for r in range(len(batch[start : start + 5]))]
    write_capture(tmp_path / "cap" / capture_name(0), records)
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")

    code = main(
        [
            "live-eval",
            str(tmp_path / "cap"),
            "--labels",
            str(tmp_path / "labels.csv"),
            "--data-dir",
            str(tmp_path / "data"),
            "--model-base-path",
            str(version_dir.parent),
            "--window",
            "1d",
            "--report",
            str(tmp_path / "live.json"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    section = json.loads((tmp_path / "live.json").read_text())["versions"][0]
    like, shifted, inverted = section["windows"]
    flagged = [w["estimate"]["shift"]["flagged"] for w in section["windows"]]
    print(
        "PSI, threshold, moved:",
        [[w["estimate"]["shift"][k] for k in ("psi", "threshold", "moved")] for w in section["windows"]],
    )
    assert flagged == [False, True, True], section["windows"]
    for w in (shifted, inverted):
        assert w["estimate_labelled"]["interval"][0] <= w["accuracy"] <= w["estimate_labelled"]["interval"][1], w
    table = [line for line in out.splitlines() if line.strip().startswith(("20", "v1"))]
    assert [line.count("!") for line in table[1:]] == [0, 2, 2], out  # every answer's estimate and the labelled's
    assert "confidences moved from its held-out split's in 2 window(s)" in err
    assert (tmp_path / "live.html").read_text().count("FLAGGED: confidences moved") >= 2  # the two days
    said = {
        name: (w["accuracy"], w["estimate_labelled"]["value"], w["estimate_labelled"]["error"])
        for name, w in (("like held-out", like), ("shifted", shifted))
    }
    print("realised, estimate, stated error:", said, [w["estimate"]["value"] for w in section["windows"]])
    realised, estimated, error = said["like held-out"]
    assert abs(realised - estimated) <= error, said
    assert said["shifted"][0] < realised - 0.05, f"the noise did not lower the accuracy: {said}"
    assert said["shifted"][1] < estimated - 0.05, f"the estimate did not drop with it: {said}"
    assert section["calibration"]["examples"] == len(held_out)

    # The eval image has no TensorFlow: the same estimate from the report's calibration, in a process that cannot
    # import it.
    core = subprocess.run(
        [
            sys.executable,
            "-c",
            CORE_INSTALL,
            "live-eval",
            str(tmp_path / "cap"),
            "--labels",
            str(tmp_path / "labels.csv"),
            "--data-dir",
            str(tmp_path / "data"),
            "--calibrations",
            str(tmp_path / "live.json"),
            "--window",
            "1d",
            "--report",
            str(tmp_path / "core.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert core.returncode == 0, core.stderr
    assert json.loads(core.stdout.strip().splitlines()[-1]) == [], "live-eval imported TensorFlow or Keras"
    reused = json.loads((tmp_path / "core.json").read_text())["versions"][0]
    assert [w["estimate"] for w in reused["windows"]] == [w["estimate"] for w in section["windows"]]
