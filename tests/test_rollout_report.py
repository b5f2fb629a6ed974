"""The decision report's reading of a rollout history: each check's numbers kept beside its words, the account of
one rollout (its stints, holds, pauses and resumes, per-replica counts), its verdict in one sentence, histories
from before the numbers, the `trainserve rollout report` command, and a page that cannot be written changing no
decision. (The page in a browser, after real controller runs: test_rollout_report_html.py.)"""

from __future__ import annotations

import json
import logging

import pytest
from rollout_histories import CANARY_FAILS, GATE, OFFLINE, PLAN, SHADOW_PASSES, History
from test_rollout_safety import CANARY_STEP, Applied, Replicas, begun, controller, site  # noqa: F401

from trainserve.cli import build_parser, main
from trainserve.rollout import analysis
from trainserve.rollout.config_file import history_path
from trainserve.rollout.counting import tallied
from trainserve.rollout.measure import KEYS
from trainserve.rollout.plan import parse_plan
from trainserve.rollout.progress import PAUSED, PROMOTE, RESUMED, ROLLBACK, ROLLED_BACK
from trainserve.rollout.report.read import per_replica, read_account
from trainserve.rollout.report.words import verdict


@pytest.mark.unit
def test_each_check_keeps_its_numbers_beside_its_words():
    counts = {key: 0 for key in KEYS} | CANARY_FAILS
    found = analysis.checks(parse_plan(PLAN).steps[1], True, counts, GATE, OFFLINE)
    assert [c.name for c in found] == ["error_ratio", "slow_calls", "flip_classes", "flip_rate"]
    found = [c for c in found if c.name != "flip_classes"]  # its numbers are one class's (test_shadow_class_checks)
    units = {"error_ratio": (400, "canary requests"), "slow_calls": (400, "candidate calls timed")}
    units["flip_rate"] = (3200, "classified pairs")
    budgets = {"error_ratio": GATE.max_error_increase, "slow_calls": GATE.max_slow_increase}
    budgets["flip_rate"] = analysis.flip_budget(OFFLINE, GATE)[0]
    for check in found:
        assert (check.seen, check.unit) == units[check.name] and check.budget == budgets[check.name]
        assert check.low <= check.high
        assert f"bounds [{check.low:+.4f}, {check.high:+.4f}] vs max {check.budget:+.4f}" in check.said
    assert found[0].low > found[0].budget and found[0].result == analysis.FAIL  # 20 % errors against 0.08 %


@pytest.mark.unit
def test_a_check_that_judged_no_bounds_has_no_numbers():
    counts = {key: 0 for key in KEYS}
    (_, _, _, flips) = analysis.checks(parse_plan(PLAN).steps[0], True, counts, GATE, OFFLINE)
    assert flips.said.startswith("no classification output compared")
    assert (flips.low, flips.high, flips.budget, flips.seen, flips.unit) == (None,) * 5


def paused_resumed_rolled_back(history: History) -> None:
    """Step 1 held for want of requests, paused, entered again and passed; step 2 failed its errors."""
    history.start()
    history.step(0, {"shadow_compared": {"a": 5, "b": 7}})
    history.look(0)
    history.look(0, ended=True, state={"seen": {"shadow_compared": {"a": 9, "b": 7}}}, shadow_compared=4)
    history.look(0, ended=True)
    held = "; ".join(
        f"{c['name']}: {c['said']}" for c in json.loads(history.path.read_text().splitlines()[-1])["checks"]
    )
    history.add(PAUSED, step=0, said=held, held_seconds=5.0)
    history.step(0)
    history.look(0, ended=True, **SHADOW_PASSES)
    history.step(1)
    history.look(1, **CANARY_FAILS)
    failed = "error_ratio: too many errors"
    history.add(ROLLBACK, step=1, said=failed)
    history.add(ROLLED_BACK, said=failed)


@pytest.mark.unit
def test_the_account_of_a_paused_resumed_and_rolled_back_rollout(tmp_path):
    history = History(tmp_path / "models.config.history.jsonl")
    paused_resumed_rolled_back(history)
    account = read_account(history.path)
    assert (account.model, account.candidate, account.outcome) == ("m", 2, "rolled back")
    assert [(s.index, s.again, len(s.looks)) for s in account.stints] == [(0, False, 3), (0, True, 1), (1, False, 1)]
    assert account.stints[0].replicas == {"shadow_compared": {"a": 4, "b": 0}}
    (hold,) = account.holds  # the two looks at the step's end, one run
    assert (hold.stint.index, hold.first.number, hold.last.number) == (0, 2, 3)
    assert "shadow_errors: " in hold.why and "fewer than --gate-min-requests 20" in hold.why
    assert "flip_rate: no classification output compared" in hold.why
    moments = [(m.event, m.step) for m in account.moments]
    assert moments == [
        ("start", None),
        ("step", 0),
        ("paused", 0),
        ("step", 0),
        ("step", 1),
        ("rollback", 1),
        ("rolled-back", None),
    ]
    assert "entered again after a pause (resumed)" in account.moments[3].said
    said = verdict(account)
    error = account.stints[-1].looks[-1].checks[0]
    assert said == (
        f"Rolled back version 2 of model m at step 2 (25% 1s): error_ratio failed: bounds [{error.low:+.4f}, "
        f"{error.high:+.4f}] against its budget +0.0100 after 400 canary requests."
    )


@pytest.mark.unit
def test_a_hold_before_a_pause_and_one_after_its_resume_are_two_each_with_its_own_why(tmp_path):
    history = History(tmp_path / "models.config.history.jsonl")
    history.start()
    history.step(0)
    history.look(0, ended=True)  # no copies: fewer than --gate-min-requests
    history.add(PAUSED, step=0, said="held", held_seconds=5.0)
    history.add(RESUMED, step=0, after="a pause", counters={"le": None, "seen": {}, "counts": {}})
    history.look(0, ended=True, shadow_compared=4000)  # held now by what stable's calls do not show yet
    first, second = read_account(history.path).holds
    assert (first.first.number, first.last.number, second.first.number) == (1, 1, 2)
    assert "fewer than --gate-min-requests 20" in first.why
    assert "0 copies answered" in first.why and "0 copies answered" not in second.why


@pytest.mark.unit
def test_a_paused_rollout_says_which_checks_held_it_in_numbers(tmp_path):
    history = History(tmp_path / "h.jsonl")
    paused_resumed_rolled_back(history)
    lines = history.path.read_text().splitlines()
    history.path.write_text("\n".join(lines[:6]) + "\n")  # up to the pause
    account = read_account(history.path)
    assert account.outcome == "paused"
    said = verdict(account)
    assert said.startswith("Paused version 2 of model m at step 1 (shadow 100% 1s) after holding 5 s, the route held")
    assert "shadow_errors undecided: bounds [" in said and "after 0 copies answered" in said


@pytest.mark.unit
def test_each_replicas_count_is_tallied_as_the_step_counts_them():
    """A restart (b) counts from 0; a replica first seen late (c) starts there; the total is the step's count."""
    seen = [{"a": 100, "b": 50}, {"a": 150, "b": 10}, {"a": 170, "b": 30, "c": 5}, {"a": 171, "c": 9}]
    states = [{"seen": {"canary_requests": s}} for s in seen]
    assert per_replica(states) == {"canary_requests": {"a": 71, "b": 30, "c": 4}}
    last, counted = {}, 0
    for s in seen:
        last, counted = tallied(last, counted, s)
    assert counted == 71 + 30 + 4


@pytest.mark.unit
def test_a_history_from_before_the_numbers_is_told_in_its_words(tmp_path):
    from trainserve.rollout.report.write import write_page

    history = History(tmp_path / "h.jsonl")
    paused_resumed_rolled_back(history)
    numbers = ("low", "high", "budget", "seen", "unit")
    records = [json.loads(line) for line in history.path.read_text().splitlines()]
    for record in (r for r in records if "checks" in r):
        record["checks"] = [{k: v for k, v in c.items() if k not in numbers} for c in record["checks"]]
    history.path.write_text("".join(json.dumps(r) + "\n" for r in records))
    account = read_account(history.path)
    assert verdict(account).endswith(
        "25% 1s): error_ratio failed: error share 80/400 = 0.2000 on the canary "
        + ("vs stable's 1/1200 = 0.0008; anytime 0.95 bounds [+0.1238, +0.2821] vs max +0.0100: shown beyond it.")
    )
    html = write_page(history.path, out=tmp_path / "old.html").read_text()
    assert "<img" not in html and 'id="words-3-error_ratio"' in html and "error_ratio failed: error share" in html


@pytest.mark.unit
def test_the_last_rollout_of_the_model_is_read(tmp_path):
    history = History(tmp_path / "h.jsonl")
    paused_resumed_rolled_back(history)
    other = History(history.path, model="n")
    other.start()
    other.step(0)
    history.start()  # m's second rollout: in progress, no step yet
    assert read_account(history.path, "m").outcome == "in progress"
    assert (
        verdict(read_account(history.path, "m"))
        == "The rollout of version 2 of model m is in progress before its first step."
    )
    assert read_account(history.path, "n").stints[0].index == 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("records", "model", "fragment"),
    [
        pytest.param(0, None, "has no rollout: expected the history of a config", id="empty"),
        pytest.param(2, None, "has rollouts of models ['m', 'n']: expected --model naming one", id="two-models"),
        pytest.param(1, "x", "has no rollout of model 'x': it has rollouts of ['m']", id="other-model"),
    ],
)
def test_a_history_without_that_rollout_is_one_line_naming_what_was_expected(
    tmp_path, capsys, records, model, fragment
):
    path = tmp_path / "h.jsonl"
    path.write_text("")
    for name in ["m", "n"][:records]:
        History(path, model=name).start()
    argv = ["rollout", "report", str(path), *(["--model", model] if model else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainserve rollout: error: ") and fragment in err and "\n" not in err, err


@pytest.mark.integration
def test_the_report_verb_renders_from_the_config_or_its_history_and_rollout_still_parses(tmp_path, capsys):
    config = tmp_path / "models.config"
    config.write_text("")
    history = History(history_path(config))
    paused_resumed_rolled_back(history)
    assert main(["rollout", "report", str(config)]) == 0
    beside = tmp_path / "models.config.history-m-v2.html"
    assert capsys.readouterr().out == f"report: {beside} (open it in a browser: {beside.as_uri()})\n"
    assert main(["rollout", "report", str(history.path), "--model", "m", "--out", str(tmp_path / "x.html")]) == 0
    assert (tmp_path / "x.html").read_text() == beside.read_text()
    args = build_parser().parse_args(["rollout", "--plan", PLAN, "--model", "m"])
    assert (args.func.__name__, args.plan, args.model) == ("run_rollout", parse_plan(PLAN), "m")


@pytest.mark.unit
def test_a_report_that_cannot_be_written_changes_no_decision(site, monkeypatch, caplog):  # noqa: F811
    config, report = site
    begun(config, report, CANARY_STEP, (PROMOTE, {"step": 2}))

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr("trainserve.rollout.report.write.render_page", broken)
    caplog.set_level(logging.INFO, logger="trainserve.rollout.report.write")
    outcome = controller(config, report, Replicas(config, lag=0), Applied(config)).run()
    assert outcome.promoted and outcome.report is None
    assert "the decision report could not be written" in caplog.text and "disk full" in caplog.text
    assert not list(config.parent.glob("*.html"))


@pytest.mark.unit
def test_a_rollout_that_ends_writes_its_report_beside_the_history(site):  # noqa: F811
    config, report = site
    begun(config, report, CANARY_STEP, (PROMOTE, {"step": 2}))
    outcome = controller(config, report, Replicas(config, lag=0), Applied(config)).run()
    assert outcome.report == config.parent / "models.config.history-m-v2.html"
    assert 'id="verdict">Promoted version 2 of model m to stable' in outcome.report.read_text()
