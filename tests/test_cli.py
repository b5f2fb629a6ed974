"""Every command's --help, flags from TRAINSERVE_* variables, and one-line errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_one_line_error, run_cli
from trainserve.cli import build_parser, main

COMMANDS = [
    "train",
    "verify",
    "runs",
    "tf-config",
    "serve-local",
    "eval",
    "load",
    "report",
    "live-eval",
    "live-eval-merge",
    "replay",
    "replay-merge",
    "drift",
    "drift-merge",
    "proxy",
    "proxy export",
    "candidate",
    "promote",
    "rollback",
    "rollout",
]
# Each stage owns its commands: trainserve.<stage>.commands builds their parsers; cli.py only dispatches.
STAGE_COMMANDS = {
    "training": {"train", "verify", "runs", "tf-config"},
    "serving": {"serve-local"},
    "proxy": {"proxy", "capture"},  # capture: its former name; `proxy export` from traffic.commands
    "evaluation": {"eval", "load", "report"},
    "live": {"live-eval", "live-eval-merge"},
    "replay": {"replay", "replay-merge"},
    "drift": {"drift", "drift-merge"},
    "rollout": {"candidate", "promote", "rollback", "rollout"},
}


@pytest.mark.unit
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command.split(), "--help"] if command else ["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: trainserve")
    if command is None:
        assert all(c.split()[0] in out for c in COMMANDS)


@pytest.mark.unit
def test_flags_come_from_environment(monkeypatch):
    monkeypatch.setenv("TRAINSERVE_EPOCHS", "7")
    monkeypatch.setenv("TRAINSERVE_MODEL_NAME", "fromenv")
    args = build_parser().parse_args(["train"])
    assert (args.epochs, args.model_name) == (7, "fromenv")
    assert build_parser().parse_args(["train", "--epochs", "2"]).epochs == 2, "the flag wins over the variable"


@pytest.mark.unit
def test_bad_environment_value_names_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("TRAINSERVE_EPOCHS", "zero")
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["train"])
    assert exit_.value.code == 2
    assert "TRAINSERVE_EPOCHS='zero'" in capsys.readouterr().err


@pytest.mark.unit
def test_switch_variables_are_read_strictly(monkeypatch, capsys):
    monkeypatch.setenv("TRAINSERVE_VERBOSE", "on")
    assert build_parser().parse_args(["train"]).verbose is True
    monkeypatch.setenv("TRAINSERVE_VERBOSE", "off")
    assert build_parser().parse_args(["train"]).verbose is False
    monkeypatch.setenv("TRAINSERVE_VERBOSE", "ture")  # a typo is an error, not "off"
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["train"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "TRAINSERVE_VERBOSE='ture'" in err and "expected true or false" in err
    assert len(err.splitlines()) == 1


def _bad_npz(tmp_path):
    x = np.zeros((4, 8, 8), np.uint8)
    np.savez(tmp_path / "nolabels.npz", x_train=x, y_train=np.zeros(4, np.int64), x_test=x)
    return tmp_path / "nolabels.npz"


@pytest.mark.parametrize(
    "args, fragment",
    [
        pytest.param(["train", "--data", "{tmp}/missing.npz"], "not found: expected an .npz", id="missing-npz"),
        pytest.param(["train", "--data", "{bad}"], "lacks y_test", id="missing-key"),
        pytest.param(["train", "--export-base", "{file}/models"], "cannot write to export directory", id="unwritable"),
        pytest.param(["verify", "{tmp}"], "is not a SavedModel: expected saved_model.pb", id="verify-not-savedmodel"),
        pytest.param(["verify", "{tmp}/nope"], "is not a directory", id="verify-missing"),
    ],
)
@pytest.mark.unit
def test_bad_input_is_one_line_and_nonzero(args, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    subs = {"tmp": str(tmp_path), "bad": str(_bad_npz(tmp_path)), "file": str(tmp_path / "file")}
    code = main([a.format(**subs) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert "error:" in err[-1] and fragment in err[-1]
    assert not (tmp_path / "models").exists(), "nothing half-written"


@pytest.mark.integration  # `trainserve train` in a fresh process imports TensorFlow
def test_cli_process_error_has_no_traceback(tmp_path):
    proc = run_cli("train", "--data", tmp_path / "missing.npz", cwd=tmp_path)
    assert_one_line_error(proc, "missing.npz not found")
    assert proc.returncode == 2


@pytest.mark.unit
def test_unknown_flag_is_rejected(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--epoch", "3x"])
    assert exit_.value.code == 2


@pytest.mark.unit
def test_a_variable_meant_for_one_command_does_not_break_another(monkeypatch):
    monkeypatch.setenv("TRAINSERVE_MODEL", "digits")  # eval's --model is a name; train's is cnn|mlp
    assert build_parser().parse_args(["eval"]).model == "digits"
    assert build_parser().parse_args(["train"]).architecture == "auto"


@pytest.mark.unit
def test_train_model_flag_still_works_with_a_deprecation_warning(capsys):
    assert build_parser().parse_args(["train", "--model", "mlp"]).architecture == "mlp"
    assert "--model is deprecated" in capsys.readouterr().err
    assert build_parser().parse_args(["train", "--architecture", "mlp"]).architecture == "mlp"
    assert "deprecated" not in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize("command", ["train", "eval"])
def test_cli_defaults_and_choices_come_from_the_config_dataclass(command):
    from trainserve.evaluation.config import EvalConfig
    from trainserve.options import config_from_args
    from trainserve.training.config import STRATEGIES, TrainConfig

    cls = {"train": TrainConfig, "eval": EvalConfig}[command]
    parser = build_parser()
    assert config_from_args(cls, parser.parse_args([command])) == cls(), "a flag's default differs from its field's"
    if command == "train":
        sub = parser._subparsers._group_actions[0].choices["train"]
        strategy = next(a for a in sub._actions if a.dest == "strategy")
        assert tuple(strategy.choices) == STRATEGIES


@pytest.mark.unit
@pytest.mark.parametrize("stage", STAGE_COMMANDS)
def test_each_stage_registers_its_own_commands(stage):
    import argparse
    import importlib

    module = importlib.import_module(f"trainserve.{stage}.commands")
    commands = argparse.ArgumentParser().add_subparsers()
    module.add_parsers(commands)
    assert set(commands.choices) == STAGE_COMMANDS[stage]
    assert set(commands.choices) <= set(build_parser()._subparsers._group_actions[0].choices)


@pytest.mark.unit
def test_cli_only_dispatches():
    """No parser is built in cli.py: an `add_parser` call there means a command that left its stage."""
    import inspect

    import trainserve.cli

    assert "add_parser(" not in inspect.getsource(trainserve.cli)


# --- TLS towards the server: one declaration (trainserve.tls.ClientTls), every client ---------------------------
CLIENTS = {
    "eval": [],
    "load": [],
    "replay": ["captures"],
    "candidate": [],
    "promote": ["--report", "r.json"],
    "rollback": [],
}
POSITIONAL = {"replay": ["captures"]}  # what a command needs before its flags
TLS_VARIABLES = {
    "TRAINSERVE_TLS_CA": "/run/ca.crt",
    "TRAINSERVE_TLS_CERT": "/run/tls.crt",
    "TRAINSERVE_TLS_KEY": "/run/tls.key",
    "TRAINSERVE_TLS_SERVER_NAME": "serve-cpu",
}


def client_config(command: str, args: list[str]):
    from trainserve.evaluation.config import EvalConfig
    from trainserve.evaluation.load.config import LoadConfig
    from trainserve.options import config_from_args
    from trainserve.replay.config import ReplayConfig
    from trainserve.rollout.config import CandidateConfig, PromoteConfig, RollbackConfig

    classes = {
        "eval": EvalConfig,
        "load": LoadConfig,
        "replay": ReplayConfig,
        "candidate": CandidateConfig,
        "promote": PromoteConfig,
        "rollback": RollbackConfig,
    }
    return config_from_args(classes[command], build_parser().parse_args([command, *POSITIONAL.get(command, []), *args]))


@pytest.mark.unit
@pytest.mark.parametrize("command", CLIENTS)
def test_every_client_takes_the_tls_flags_and_their_variables(command, monkeypatch):
    from pathlib import Path

    from trainserve.tls import ClientTls

    flags = ["--tls-ca", "ca.pem", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-server-name", "serving"]
    assert client_config(command, flags).tls == ClientTls(Path("ca.pem"), Path("c.pem"), Path("k.pem"), "serving")
    assert client_config(command, []).tls == ClientTls(), "no flag: plaintext"
    for name, value in TLS_VARIABLES.items():
        monkeypatch.setenv(name, value)
    assert client_config(command, []).tls == ClientTls(
        Path("/run/ca.crt"), Path("/run/tls.crt"), Path("/run/tls.key"), "serve-cpu"
    )
    assert client_config(command, ["--tls-server-name", "other"]).tls.server_name == "other", "the flag wins"


@pytest.mark.unit
@pytest.mark.parametrize("command", CLIENTS)
@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--tls-cert", "c.pem"], "--tls-cert without --tls-key: expected both (mutual TLS) or neither"),
        (["--tls-key", "k.pem"], "--tls-key without --tls-cert"),
        (["--tls-server-name", "serving"], "--tls-server-name needs TLS: expected --tls-ca"),
    ],
    ids=["cert-without-key", "key-without-cert", "name-without-tls"],
)
def test_a_half_given_tls_is_one_line_before_any_request(command, flags, fragment, tmp_path, capsys, monkeypatch):
    """The server (port 1) is never asked: a request would end in 'not AVAILABLE', not in this line."""
    monkeypatch.chdir(tmp_path)
    code = main([command, *CLIENTS[command], "--server", "127.0.0.1:1", "--wait", "0", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and fragment in err[0], err
    assert not list(tmp_path.iterdir()), "nothing written"


@pytest.mark.unit
def test_compose_and_kubernetes_set_exactly_the_variables_the_clients_read():
    import yaml

    from conftest import REPO

    sub = build_parser()._subparsers._group_actions[0].choices["eval"]
    read = {f"TRAINSERVE_{a.dest.upper()}" for a in sub._actions if a.dest.startswith("tls_")}
    assert read == set(TLS_VARIABLES)
    compose = yaml.safe_load((REPO / "compose.tls.yaml").read_text())
    assert set(compose["x-client-tls"]["environment"]) == read
    kustomization = yaml.safe_load((REPO / "k8s" / "components" / "tls" / "kustomization.yaml").read_text())
    (client_tls,) = kustomization["configMapGenerator"]
    assert {literal.partition("=")[0] for literal in client_tls["literals"]} == read


@pytest.mark.unit
def test_the_program_collects_then_freezes_before_it_exits_and_main_does_not(monkeypatch):
    """`trainserve` (console) ends with gc.collect then gc.freeze, so that the interpreter's teardown skips what
    is alive (seconds with TensorFlow loaded) while garbage's finalizers have run; `main`, which tests call in
    their own process, freezes nothing."""
    import gc
    import inspect

    import trainserve.cli

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect"))
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(trainserve.cli, "main", lambda: calls.append("main") or 3)
    assert trainserve.cli.console() == 3
    assert calls == ["main", "collect", "freeze"]
    assert "leave_quickly" not in inspect.getsource(main)
