"""The training curves' plot (trainserve.plots) from Keras' CSVLogger file."""

from __future__ import annotations

import pytest


@pytest.mark.unit
def test_curves_are_drawn_for_a_training_without_validation_data(tmp_path):
    """Keras' CSVLogger writes NA in the val_ columns when there is no validation data (--validation-split 0):
    the curves are drawn from the numbers there are, not a traceback after the version was published."""
    from trainserve.plots import plot_training_curves

    history = tmp_path / "history.csv"
    history.write_text("epoch,accuracy,loss,val_accuracy,val_loss\n0,0.25,1.09,NA,NA\n1,0.5,1.02,NA,NA\n")
    out = plot_training_curves(history, tmp_path / "training_curves.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
