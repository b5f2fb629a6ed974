"""Capture under the faults production brings (issue 45): a directory deleted mid-run, a slow volume at shutdown,
one record larger than the bound, two servers sharing a prefix, a full or read-only volume, trainserve's own calls,
a REST call answered with an error. Each test checks that every record offered is accounted for (offered = written
+ dropped + lost), what is on disk agrees with the counters, the log says it once, and no caller waited."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DIRECT, MONITORING, install_version
from trainserve.model_server_config import render_model_config, single_model_config
from trainserve.protos import prediction_log_pb2
from trainserve.tfrecord import frame, iter_records
from trainserve.traffic import writer as writer_module
from trainserve.traffic.accounting import (
    CLOSED,
    DIRECTORY_GONE,
    ORIGIN,
    QUEUE_FULL,
    REMOVED,
    ROTATION,
    SHUTDOWN,
    TOO_LARGE,
    WRITE_ERROR,
    Accounting,
)
from trainserve.traffic.metrics import DROPPED, LOST, OFFERED, PENDING, SKIPPED, WRITTEN
from trainserve.traffic.origin import ORIGIN_HEADER
from trainserve.traffic.writer import MIB, TrafficWriter, WriterLimits

SEQ = re.compile(r"-(?P<token>[0-9a-f]{8})-\d{8}T\d{6}-(?P<seq>\d{5})\.tfrecord$")


def payload(i: int) -> bytes:
    return f"record {i:06d} ".encode() * 4


def records_in(directory: Path, token: str | None = None, prefix: str = "") -> list[bytes]:
    """Every record of the capture files (of one writer's `token`, or all; named `prefix`...), each writer's files
    in order."""
    out = []
    files = [p for p in directory.glob(f"{prefix}*.tfrecord") if token is None or SEQ.search(p.name)["token"] == token]
    for path in sorted(files, key=lambda p: (SEQ.search(p.name)["token"], int(SEQ.search(p.name)["seq"]))):
        with open(path, "rb") as stream:
            out += list(iter_records(stream))
    return out


def assert_adds_up(counts: Accounting) -> None:
    assert counts.pending == 0, counts
    assert counts.offered == counts.written + sum(counts.dropped.values()) + sum(counts.lost.values()), counts


def wait_settled(writer: TrafficWriter) -> None:
    """Until every record offered so far is written, dropped or lost (the writer's thread is idle)."""
    deadline = time.monotonic() + 30
    while writer.accounting().pending:
        assert time.monotonic() < deadline, writer.accounting()
        time.sleep(0.005)


def warnings(caplog, fragment: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if fragment in r.getMessage()]


@pytest.fixture
def stuck_volume(monkeypatch):
    """Every write of every capture file blocks until `release` is set (a hung volume); `entered` is set when the
    first write is blocked."""
    entered, release = threading.Event(), threading.Event()
    real = writer_module.write_all

    def stuck(fd: int, data: bytes) -> None:
        entered.set()
        release.wait()
        real(fd, data)

    monkeypatch.setattr(writer_module, "write_all", stuck)
    yield entered, release
    release.set()


@pytest.mark.unit
def test_a_directory_deleted_mid_run_is_made_again_and_what_it_held_is_counted_deleted(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trainserve")
    directory = tmp_path / "captures"
    writer = TrafficWriter(directory / "cap")
    for i in range(20):
        writer.submit(payload(i))
    wait_settled(writer)
    shutil.rmtree(directory)
    for i in range(20, 45):
        assert writer.submit(payload(i))
    counts = writer.close()
    assert_adds_up(counts)
    assert records_in(directory) == [payload(i) for i in range(20, 45)]  # today: written into the unlinked file
    assert (counts.offered, counts.written, counts.deleted[REMOVED]) == (45, 45, 20)
    assert counts.written - sum(counts.deleted.values()) == len(records_in(directory))
    assert len(warnings(caplog, "was deleted or moved while being written")) == 1


@pytest.mark.unit
def test_a_capture_directory_moved_away_is_noticed_by_its_path(tmp_path, monkeypatch, caplog):
    """A move keeps the open file linked (as NFS keeps a deleted one, renamed): the path check notices."""
    caplog.set_level(logging.INFO, logger="trainserve")
    monkeypatch.setattr(writer_module, "PATH_CHECK_SECONDS", 0.0)
    directory = tmp_path / "captures"
    writer = TrafficWriter(directory / "cap")
    for i in range(5):
        writer.submit(payload(i))
    wait_settled(writer)
    directory.rename(tmp_path / "moved")
    for i in range(5, 12):
        writer.submit(payload(i))
    counts = writer.close()
    assert_adds_up(counts)
    assert records_in(tmp_path / "moved") == [payload(i) for i in range(5)]
    assert records_in(directory) == [payload(i) for i in range(5, 12)]
    assert (counts.written, counts.deleted[REMOVED]) == (12, 5)
    assert len(warnings(caplog, "was deleted or moved while being written")) == 1


@pytest.mark.unit
def test_a_record_written_as_its_directory_is_deleted_is_counted_lost(tmp_path, monkeypatch):
    directory, real, writes = tmp_path / "captures", writer_module.write_all, []

    def deleting_on_the_sixth(fd: int, data: bytes) -> None:
        writes.append(len(data))
        if len(writes) == 6:
            shutil.rmtree(directory)  # between the writer's check and its write
        real(fd, data)

    monkeypatch.setattr(writer_module, "write_all", deleting_on_the_sixth)
    writer = TrafficWriter(directory / "cap")
    for i in range(10):
        writer.submit(payload(i))
    counts = writer.close()
    assert_adds_up(counts)
    assert (counts.written, counts.lost[DIRECTORY_GONE], counts.deleted[REMOVED]) == (9, 1, 5)
    assert records_in(directory) == [payload(i) for i in range(6, 10)]
    assert counts.written - sum(counts.deleted.values()) == 4


@pytest.mark.unit
def test_shutdown_on_a_stuck_volume_counts_the_queue_as_lost_in_one_line(tmp_path, stuck_volume, caplog):
    caplog.set_level(logging.INFO, logger="trainserve")
    entered, release = stuck_volume
    writer = TrafficWriter(tmp_path / "cap", WriterLimits(queue_records=5))
    writer.submit(payload(0))
    assert entered.wait(30)
    accepted = [writer.submit(payload(i)) for i in range(1, 13)]  # each returned: nobody waited on the volume
    assert accepted == [True] * 5 + [False] * 7
    counts = writer.close(timeout=0.1)  # the volume stays stuck past the deadline
    assert_adds_up(counts)
    # The record being written at the deadline counts lost too: it may land, but nothing says it did.
    assert (counts.offered, counts.written, counts.dropped[QUEUE_FULL], counts.lost[SHUTDOWN]) == (13, 0, 7, 6)
    assert writer.submit(payload(99)) is False
    release.set()
    writer._thread.join(30)
    after = writer.accounting()
    assert_adds_up(after)
    assert after.dropped[CLOSED] == 1 and after.written == 0 and after.lost == counts.lost  # nothing counted twice
    (line,) = warnings(caplog, "still queued")
    assert "6 record(s) still queued after 0.1 s" in line and "dropped queue_full 7, lost shutdown 6" in line
    assert len(warnings(caplog, "records wait for the disk")) == 1


@pytest.mark.unit
def test_a_record_larger_than_the_bound_is_dropped_and_the_capture_kept(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trainserve")
    size = len(frame(payload(0)))
    limits = WriterLimits(max_file_mb=3 * size / MIB, max_total_mb=10 * size / MIB)
    writer = TrafficWriter(tmp_path / "cap", limits)
    for i in range(8):
        writer.submit(payload(i))
    writer.submit(b"x" * (11 * size))  # larger than the whole bound: today it deleted every other file
    writer.submit(b"x" * (4 * size))  # larger than a file
    for i in range(8, 10):
        writer.submit(payload(i))
    counts = writer.close()
    assert_adds_up(counts)
    assert counts.dropped[TOO_LARGE] == 2 and counts.written == 10 and counts.deleted[ROTATION] == 0
    assert records_in(tmp_path) == [payload(i) for i in range(10)]
    assert sum(p.stat().st_size for p in tmp_path.glob("*.tfrecord")) <= limits.max_total_bytes
    assert len(warnings(caplog, "exceeds max_file_mb")) == 1


@pytest.mark.unit
@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(0, 700), max_size=40),
    max_file=st.integers(64, 600),
    files_in_total=st.integers(1, 4),
)
def test_rotation_keeps_the_newest_records_within_the_bound_and_counts_what_it_deleted(
    tmp_path_factory, sizes, max_file, files_in_total
):
    directory = tmp_path_factory.mktemp("rotation")
    limits = WriterLimits(max_file_mb=max_file / MIB, max_total_mb=files_in_total * max_file / MIB)
    writer = TrafficWriter(directory / "cap", limits)
    records = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    for record in records:
        writer.submit(record)
    counts = writer.close()
    assert_adds_up(counts)
    fitting = [r for r in records if len(frame(r)) <= limits.max_file_bytes]
    assert counts.dropped[TOO_LARGE] == len(records) - len(fitting) and counts.written == len(fitting)
    kept = records_in(directory)
    assert len(kept) == counts.written - counts.deleted[ROTATION]
    assert kept == fitting[len(fitting) - len(kept) :]  # the newest, in order
    assert bool(kept) == bool(fitting)  # the newest record is never rotated away
    assert sum(p.stat().st_size for p in directory.glob("*.tfrecord")) <= limits.max_total_bytes


@pytest.mark.unit
def test_writers_sharing_a_prefix_on_one_host_keep_to_their_own_files(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trainserve")
    size = len(frame(payload(0)))
    limits = WriterLimits(max_file_mb=2 * size / MIB, max_total_mb=6 * size / MIB)
    first, second = TrafficWriter(tmp_path / "cap", limits), TrafficWriter(tmp_path / "cap", limits)
    for i in range(30):
        first.submit(payload(i))
        second.submit(payload(1000 + i))
    wait_settled(first)
    wait_settled(second)
    assert records_in(tmp_path, first.token) == [payload(i) for i in range(24, 30)]
    assert records_in(tmp_path, second.token) == [payload(1000 + i) for i in range(24, 30)]
    firsts = first.close()
    # A restarted server adopts its dead predecessor's files (first's lock went with it), not a live writer's.
    third = TrafficWriter(tmp_path / "cap", limits)
    for i in range(4):
        third.submit(payload(2000 + i))
    thirds = third.close()
    seconds = second.close()
    for counts in (firsts, seconds, thirds):
        assert_adds_up(counts)
    assert records_in(tmp_path, second.token) == [payload(1000 + i) for i in range(24, 30)]
    assert records_in(tmp_path, first.token) == [payload(i) for i in range(28, 30)]  # two files of it went
    assert records_in(tmp_path, third.token) == [payload(2000 + i) for i in range(4)]
    assert seconds.written - seconds.deleted[ROTATION] == 6 == firsts.written - firsts.deleted[ROTATION]
    assert len(warnings(caplog, "of earlier runs on this host")) == 1


@pytest.fixture
def small_volume(tmp_path):
    """A 64 KiB tmpfs (a full disk after a few dozen records); remount(options) changes it while mounted."""
    mount = tmp_path / "volume"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root: {made.stderr.decode().strip()}")

    def remount(options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(mount)], check=True)

    yield mount, remount
    subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.mark.integration
def test_a_full_volume_drops_and_counts_leaves_no_empty_files_and_says_so_twice(small_volume, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="trainserve")
    monkeypatch.setattr(writer_module, "RETRY_SECONDS", 0.0)  # every record tries a new file: the worst case
    volume, remount = small_volume
    writer = TrafficWriter(volume / "cap")
    record = b"y" * 1000
    for _ in range(150):  # 150 kB into 64 KiB
        writer.submit(record)
    wait_settled(writer)
    full = writer.accounting()
    assert full.written > 20 and full.dropped[WRITE_ERROR] == 150 - full.written
    assert [p.name for p in volume.glob("*.tfrecord") if p.stat().st_size == 0] == []
    assert len(records_in(volume)) == full.written
    remount("size=1m")
    for _ in range(10):
        writer.submit(record)
    counts = writer.close()
    assert_adds_up(counts)
    assert counts.written == full.written + 10 == len(records_in(volume))
    (fault,) = warnings(caplog, "cannot write")
    assert "No space left on device" in fault
    (cleared,) = warnings(caplog, "writing again")
    assert f"{full.dropped[WRITE_ERROR]} record(s) dropped (write_error)" in cleared


@pytest.mark.integration
def test_a_read_only_volume_is_logged_once_not_every_retry(small_volume, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="trainserve")
    monkeypatch.setattr(writer_module, "RETRY_SECONDS", 0.0)
    volume, remount = small_volume
    (volume / "captures").mkdir()
    remount("ro")
    writer = TrafficWriter(volume / "captures" / "cap")
    for i in range(20):
        writer.submit(payload(i))
    wait_settled(writer)
    remount("rw")
    writer.submit(payload(20))
    counts = writer.close()
    assert_adds_up(counts)
    assert (counts.written, counts.dropped[WRITE_ERROR]) == (1, 20)
    assert records_in(volume / "captures") == [payload(20)]
    assert len(warnings(caplog, "Read-only file system")) == 1 and len(warnings(caplog, "writing again")) == 1


# serve-local


def page_counts(server) -> dict[str, dict[str, int]]:
    """The capture series of the Prometheus page, per filename_prefix: name (and reason) -> value."""
    text = DIRECT.open(server.rest + "/monitoring/prometheus/metrics", timeout=10).read().decode()
    counts: dict[str, dict[str, int]] = {}
    for name in (OFFERED, WRITTEN, DROPPED, LOST, PENDING, SKIPPED):
        for labels, value in re.findall(rf"^{re.escape(name)}{{(.*)}} (\d+)$", text, re.M):
            prefix = re.search(r'filename_prefix="([^"]*)"', labels)[1]
            reason = re.search(r'reason="([^"]*)"', labels)
            key = name.rsplit(":", 1)[1] + (f":{reason[1]}" if reason else "")
            counts.setdefault(Path(prefix).name, {})[key] = int(value)
    return counts


def adds_up(counts: dict[str, int]) -> bool:
    settled = sum(n for key, n in counts.items() if key.startswith(("records_dropped", "records_lost")))
    return counts["records_pending"] == 0 and counts["records_offered"] == counts["records_written"] + settled


@pytest.mark.integration
def test_serve_local_shutdown_on_a_stuck_volume_counts_the_queue_lost(
    model_versions, tmp_path, serve_in_process, stuck_volume, caplog
):
    from serving_fixtures import predict_request, stubs

    entered, _ = stuck_volume
    server = serve_logging(model_versions, tmp_path, serve_in_process, 1.0, "--capture_queue_records=5")
    predict, _ = stubs(server)
    predict.Predict(predict_request(), timeout=30)
    assert entered.wait(30)
    for _ in range(12):  # answered while the volume is stuck: no call waits on the capture
        predict.Predict(predict_request(), timeout=30)
    counts = page_counts(server)["m"]
    assert (counts["records_offered"], counts["records_dropped:queue_full"], counts["records_pending"]) == (13, 7, 6)
    assert server.stop() == 0
    (line,) = [line for line in server.log().splitlines() if "still queued" in line]
    assert "6 record(s) still queued after 0.2 s" in line
    assert "offered 13, written 0, dropped queue_full 7, lost shutdown 6, pending 0" in line


def serve_logging(model_versions, tmp_path: Path, serve_in_process, rate: float, *flags: str):
    """serve-local serving the digits model as m, logging `rate` of its calls under tmp_path/captures/m."""
    install_version(model_versions[0], tmp_path / "m", 1)
    (tmp_path / "monitoring.config").write_text(MONITORING)
    config = single_model_config("m", str(tmp_path / "m"))
    logging_config = config.model_config_list.config[0].logging_config
    logging_config.sampling_config.sampling_rate = rate
    logging_config.log_collector_config.filename_prefix = str(tmp_path / "captures" / "m")
    (tmp_path / "models.config").write_text(render_model_config(config))
    server = serve_in_process(
        f"--model_config_file={tmp_path / 'models.config'}",
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}",
        "--capture_drain_seconds=0.2",
        *flags,
    )
    server.wait_available("m", 1)
    return server


def save_scalar_model(path: Path) -> Path:
    """x float32 [None] -> y (x * 2, batched) and n (a scalar): an answer REST cannot write as rows."""
    import tensorflow as tf

    class Scalar(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return {"y": x * 2.0, "n": tf.size(x)}

    module = Scalar()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def rest_predict(server, model: str, body: dict, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        f"{server.rest}/v1/models/{model}:predict", json.dumps(body).encode(), headers, method="POST"
    )
    try:
        with DIRECT.open(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.integration
def test_serve_local_skips_its_own_calls_and_unanswered_rest_and_logs_capture_turned_on(
    model_versions, tmp_path, serve_in_process
):
    from serving_fixtures import predict_request, stubs

    install_version(model_versions[0], tmp_path / "m", 1)
    save_scalar_model(tmp_path / "s" / "1")
    (tmp_path / "monitoring.config").write_text(MONITORING)

    def write_config(rate: float) -> Path:
        config = single_model_config("m", str(tmp_path / "m"))
        scalar = config.model_config_list.config.add(name="s", base_path=str(tmp_path / "s"))
        scalar.model_platform = "tensorflow"
        for model in config.model_config_list.config:
            model.logging_config.sampling_config.sampling_rate = rate
            model.logging_config.log_collector_config.filename_prefix = str(tmp_path / "captures" / model.name)
        (tmp_path / "models.config").write_text(render_model_config(config))
        return tmp_path / "models.config"

    server = serve_in_process(
        f"--model_config_file={write_config(0.0)}",
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}",
        "--model_config_file_poll_wait_seconds=1",
    )
    server.wait_available("s", 1)
    write_config(1.0)
    server.wait_for(lambda: "capture on:" in server.log(), "the reload turning capture on, logged")
    (turned_on,) = [line for line in server.log().splitlines() if "capture on:" in line]
    assert f"m 1 of Predict calls to {tmp_path / 'captures' / 'm'}" in turned_on and "s 1 of" in turned_on

    predict, _ = stubs(server)
    for origin in ("replay", "eval"):  # trainserve's own calls: answered, not captured
        predict.Predict(predict_request(), metadata=[(ORIGIN_HEADER, origin), ("x-request-id", origin)], timeout=30)
    predict.Predict(predict_request(), metadata=[("x-request-id", "grpc-client")], timeout=30)
    digits = {"instances": [[[[0]] * 8] * 8]}
    assert rest_predict(server, "m", digits, {ORIGIN_HEADER.title(): "load", "x-request-id": "load"}) == 200
    assert rest_predict(server, "m", digits, {"x-request-id": "rest-client"}) == 200
    # s answers, but REST cannot write its scalar output as rows: a 400 the client got, so no record of it.
    assert rest_predict(server, "s", {"instances": [1.0, 2.0]}, {"x-request-id": "rows"}) == 400
    assert rest_predict(server, "s", {"inputs": [1.0, 2.0]}, {"x-request-id": "columns"}) == 200

    server.wait_for(lambda: all(adds_up(c) for c in page_counts(server).values()), "every record settled")
    counts = page_counts(server)
    assert counts["m"]["records_offered"] == counts["m"]["records_written"] == 2
    assert counts["m"][f"calls_skipped:{ORIGIN}"] == 3
    assert counts["s"]["records_offered"] == counts["s"]["records_written"] == 1
    assert server.stop() == 0
    origins = {
        name: sorted(prediction_log_pb2.PredictionLog.FromString(r).log_metadata.request_origin for r in records)
        for name in ("m", "s")
        for records in [records_in(tmp_path / "captures", prefix=f"{name}-")]
    }
    assert origins == {"m": ["grpc-client", "rest-client"], "s": ["columns"]}
    assert sum("capture m: closed; offered 2, written 2" in line for line in server.log().splitlines()) == 1
