"""The decision report after real controller runs (the stand-in proxy and the real Prometheus of
test_rollout_controller.py): a rollout that pauses, is resumed and promoted, and one rolled back, each leave the page
beside the history and say where it is; the page opened in headless Chromium as eval.html is (test_report_html.py)
shows the verdict, each check's bounds and budget, a plot per check that decodes, the holds and the pause."""

from __future__ import annotations

import pytest
from test_report_html import opened
from test_rollout_controller import Traffic, rollout_args, site, watched  # noqa: F401

from trainserve.cli import main
from trainserve.rollout.config_file import history_path
from trainserve.rollout.report.plots import has_bounds
from trainserve.rollout.report.read import read_account
from trainserve.rollout.report.words import bounds, budget, verdict

pytestmark = pytest.mark.integration  # a Prometheus process, a browser


def test_a_paused_then_promoted_rollouts_report_reads_in_a_browser(watched, tmp_path, capsys):  # noqa: F811
    proxy, prometheus = watched
    config, report = site(tmp_path, "quiet")
    traffic = proxy.add("quiet", Traffic(config.parent / "routing.json", 1, 2, flowing=False))
    page = config.parent / "models.config.history-quiet-v2.html"
    assert main(rollout_args(config, report, prometheus, "--max-hold", "0.5")) == 75
    assert capsys.readouterr().err.strip().endswith(f"; decision report: {page}")
    assert 'id="verdict">Paused version 2 of model quiet at step 1 (shadow 100% 1s) after holding' in page.read_text()
    traffic.flowing = True
    assert main(rollout_args(config, report, prometheus)) == 0
    assert f"decision report: {page} (open it in a browser: {page.as_uri()})" in capsys.readouterr().out
    account = read_account(history_path(config))
    _, seen = opened(page, tmp_path)
    assert seen.texts["verdict"] == verdict(account)
    assert verdict(account).startswith("Promoted version 2 of model quiet to stable: every check passed at each step")
    assert account.start["report_sha256"] in seen.texts["evidence"] and "the same bytes" in seen.texts["evidence"]
    assert [(s.index, s.again) for s in account.stints] == [(0, False), (1, False)]  # the paused step resumed
    plotted = set()
    for k, stint in enumerate(account.stints, 1):
        for check in stint.looks[-1].checks:  # each check's bound and budget, as numbers, in its step's table
            assert check.name in seen.texts[f"checks-{k}"]
            assert bounds(check) in seen.texts[f"checks-{k}"] and budget(check) in seen.texts[f"checks-{k}"]
        plotted |= {f"bounds-{k}-{name}" for name in stint.check_names() if has_bounds(stint, name)}
    canary = {"bounds-2-error_ratio", "bounds-2-slow_calls", "bounds-2-flip_rate", "bounds-1-shadow_errors"}
    assert canary <= plotted and "+0.0100" in seen.texts["checks-2"]
    images = {image["id"]: image for image in seen.images}
    assert set(images) == plotted  # a plot per check that had bounds: none for flips with nothing classified
    assert all(int(i["data-natural-width"]) > 100 and int(i["data-natural-height"]) > 100 for i in images.values())
    assert "fewer than --gate-min-requests 20" in seen.texts["holds"]
    assert "paused" in seen.texts["timeline"] and "resumed after a pause with its counts" in seen.texts["timeline"]
    assert proxy.target in seen.texts["replicas-2"] and "canary_requests" in seen.texts["replicas-2"]  # by instance


def test_a_rolled_back_rollout_leaves_its_report_beside_the_history(watched, tmp_path, capsys):  # noqa: F811
    proxy, prometheus = watched
    config, report = site(tmp_path, "flips")
    proxy.add("flips", Traffic(config.parent / "routing.json", 1, 2, flip_share=0.2))
    assert main(rollout_args(config, report, prometheus)) == 1
    page = config.parent / "models.config.history-flips-v2.html"
    assert f"decision report: {page}" in capsys.readouterr().out
    said = verdict(read_account(history_path(config)))
    assert said.startswith("Rolled back version 2 of model flips at step 1 (shadow 100% 1s): flip_rate failed: bounds")
    assert f'id="verdict">{said}' in page.read_text().replace("&#x27;", "'")
