"""Every client over TLS, through its command line (`main([...])`): `eval`, `load` and `candidate` against a
serve-local that requires client certificates (mutual TLS), with certificates made at test time (test_tls.py's
`pki`). Each refusal (no certificate, a CA that does not trust the server, plaintext against TLS, TLS against
plaintext, an expired certificate, a name the certificate lacks) ends `trainserve eval --wait 600` at once with
one line naming it, instead of waiting out the 600 s and saying UNAVAILABLE."""

from __future__ import annotations

import json

import numpy as np
import pytest
from reports import compared_with, eval_report, write
from test_tls import SERVICE, Pki, make_pki, ssl_config, start_server  # noqa: F401 (make_pki: the fixture `pki`)

from conftest import QUICK_SWEEP, install_version
from serving_fixtures import InProcessServer
from trainserve.cli import main

# The unit tests here: serve-local on a thread of this process; the clients are this process's own.
IMAGES = np.random.default_rng(5).integers(0, 256, (40, 8, 8, 1), dtype=np.uint8)


def tls_flags(pki: Pki, client: str = "client", ca: str = "ca", server_name: str | None = SERVICE) -> list[str]:
    flags = ["--tls-ca", str(pki.root / f"{ca}.crt")]
    if client:
        flags += ["--tls-cert", str(pki.root / f"{client}.crt"), "--tls-key", str(pki.root / f"{client}.key")]
    return flags + (["--tls-server-name", server_name] if server_name else [])


@pytest.fixture(scope="module")
def servers(tmp_path_factory, model_versions, pki):
    """(mutual TLS server, plaintext server), both serving m v1; and held-out data for it."""
    tmp = tmp_path_factory.mktemp("tls-clients")
    mutual = start_server(tmp / "mtls", model_versions[0], f"--ssl_config_file={ssl_config(tmp / 'ssl', pki, True)}")
    plaintext = start_server(tmp / "plain", model_versions[0])
    yield mutual, plaintext
    assert mutual.stop() == 0 and plaintext.stop() == 0


@pytest.fixture
def data(tmp_path):
    np.savez(tmp_path / "test.npz", x_test=IMAGES, y_test=np.arange(len(IMAGES)) % 10)
    return tmp_path / "test.npz"


@pytest.mark.unit
def test_eval_over_mutual_tls_reports_accuracy(servers, pki, data, tmp_path, capsys):
    report = tmp_path / "eval.json"
    code = main(
        [
            "eval",
            "--server",
            servers[0].target,
            "--model",
            "m",
            "--data",
            str(data),
            "--report",
            str(report),
            *tls_flags(pki),
        ]
    )
    written = json.loads(report.read_text())
    assert code == 0 and written["data"]["examples"] == len(IMAGES)
    assert 0 <= written["metrics"]["accuracy"] <= 1 and "accuracy" in capsys.readouterr().out


@pytest.mark.unit
@pytest.mark.parametrize(
    "server, flags, fragment",
    [
        pytest.param(
            0,
            lambda pki: tls_flags(pki, client=""),
            "requires a client certificate (client_verify): pass --tls-cert and --tls-key",
            id="no-certificate",
        ),
        pytest.param(
            0, lambda pki: tls_flags(pki, ca="other_ca"), "certificate is not trusted by --tls-ca", id="wrong-ca"
        ),
        pytest.param(0, lambda pki: [], "requires TLS and this client spoke plaintext", id="plaintext-against-tls"),
        pytest.param(1, lambda pki: tls_flags(pki), "speaks plaintext gRPC, not TLS", id="tls-against-plaintext"),
        pytest.param(
            0,
            lambda pki: tls_flags(pki, "expired_client"),
            "refused the client certificate: --tls-cert",
            id="expired-certificate",
        ),
        pytest.param(
            0,
            lambda pki: tls_flags(pki, server_name=None),
            "certificate does not name '127.0.0.1'",
            id="no-server-name",
        ),
    ],
)
def test_a_refused_eval_says_which_refusal_in_one_line_without_waiting(
    servers, pki, data, capsys, server, flags, fragment
):
    """--wait 600: the call returning at all shows the wait ended at the first refusal, not after 600 s."""
    target = servers[server].target
    code = main(["eval", "--server", target, "--model", "m", "--data", str(data), "--wait", "600", *flags(pki)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"trainserve eval: error: {target}") and fragment in err[0], err[0]
    if "expired" in fragment:
        assert "expired on" in err[0]


@pytest.mark.unit
def test_load_over_mutual_tls_from_the_variables(servers, pki, tmp_path, monkeypatch):
    """TRAINSERVE_TLS_*, as compose.tls.yaml and k8s/components/tls set them."""
    flags = tls_flags(pki)
    for flag, value in zip(flags[::2], flags[1::2]):
        monkeypatch.setenv("TRAINSERVE_" + flag[2:].replace("-", "_").upper(), value)
    report = tmp_path / "load.json"
    target = ["--server", servers[0].target, "--model", "m"]
    code = main(["load", *target, "--batch-sizes", "2", *QUICK_SWEEP, "--report", str(report)])
    (point,) = json.loads(report.read_text())["points"]
    assert code == 0 and point["batch_size"] == 2 and point["requests"] > 0


@pytest.mark.integration
def test_candidate_over_mutual_tls_waits_on_the_server_and_labels_the_version(model_versions, pki, tmp_path, capsys):
    base, config = tmp_path / "m", tmp_path / "models.config"
    for version in (1, 2):
        install_version(model_versions[version - 1], base, version)
    config.write_text(
        f'model_config_list {{ config {{ name: "m" base_path: "{base}" model_platform: "tensorflow"\n'
        "  model_version_policy { specific { versions: 1 } } version_labels { key: 'stable' value: 1 } } }\n"
    )
    server = InProcessServer(
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        "--allow_version_labels_for_unavailable_models",
        f"--ssl_config_file={ssl_config(tmp_path / 'ssl', pki, True)}",
    )
    try:
        server.wait_available("m", 1)
        code = main(["candidate", "--config", str(config), "--server", server.target, "--wait", "600", *tls_flags(pki)])
        assert code == 0 and "candidate" in capsys.readouterr().out
        code, body = server.get("/v1/models/m/labels/candidate/metadata")
        assert code == 200 and int(body["model_spec"]["version"]) == 2
        report = tmp_path / "candidate.json"
        write({**compared_with(eval_report(base / "2"), 1), "server": server.target}, report)
        staged = config.read_text()
        promote = ["promote", "--config", str(config), "--report", str(report), "--server", server.target]
        assert main([*promote, "--wait", "600"]) == 2, "plaintext against TLS"
        assert "TLS" in capsys.readouterr().err and config.read_text() == staged, "refused before any rewrite"
        assert main([*promote, "--wait", "600", *tls_flags(pki)]) == 0
        assert int(server.get("/v1/models/m/labels/stable/metadata")[1]["model_spec"]["version"]) == 2
    finally:
        assert server.stop() == 0
