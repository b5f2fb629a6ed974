"""The capture writer: records land whole, named per host and process, rotated and bounded; a stuck, full or
unwritable volume drops and counts records without ever holding the caller."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainserve.errors import TrainserveError
from trainserve.tfrecord import DamagedRecord, frame, iter_records
from trainserve.traffic.accounting import ENCODE_ERROR, QUEUE_FULL, WRITE_ERROR
from trainserve.traffic.records import log_metadata, prediction_log, request_id
from trainserve.traffic.writer import MIB, TrafficWriter, WriterLimits, host_name

NAME = re.compile(
    r"^cap-(?P<host>.+)-(?P<pid>\d+)-(?P<token>[0-9a-f]{8})-(?P<stamp>\d{8}T\d{6})-(?P<seq>\d{5})\.tfrecord$"
)


def records_in(directory: Path) -> list[bytes]:
    """Every record of every capture file, files in the order they were written (their sequence number)."""
    out = []
    for path in sorted(directory.glob("*.tfrecord"), key=lambda p: int(NAME.match(p.name)["seq"])):
        with open(path, "rb") as stream:
            out += list(iter_records(stream))
    return out


def payload(i: int) -> bytes:
    return f"record {i:06d} ".encode() * 4


@pytest.mark.unit
def test_records_are_written_whole_in_order_under_names_that_carry_host_and_process(tmp_path):
    writer = TrafficWriter(tmp_path / "cap")
    for i in range(50):
        assert writer.submit(payload(i) if i % 2 else (lambda i=i: payload(i)))  # bytes, or made by the thread
    writer.close()
    assert records_in(tmp_path) == [payload(i) for i in range(50)]
    assert writer.written == 50 and sum(writer.dropped.values()) == 0
    (path,) = tmp_path.iterdir()
    match = NAME.match(path.name)
    assert match and match["host"] == host_name() and int(match["pid"]) == os.getpid(), path.name
    assert abs(time.mktime(time.strptime(match["stamp"], "%Y%m%dT%H%M%S")) - time.mktime(time.gmtime())) < 3600
    assert host_name() == re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())


@pytest.mark.unit
def test_files_rotate_by_size_and_the_oldest_go_past_the_total(tmp_path):
    size = len(frame(payload(0)))
    limits = WriterLimits(max_file_mb=3 * size / MIB, max_total_mb=10 * size / MIB)
    earlier = tmp_path / f"cap-{host_name()}-1-20200101T000000-00001.tfrecord"  # a previous run's file counts
    earlier.write_bytes(frame(b"old") * 2)
    other_host = tmp_path / "cap-elsewhere-1-20200101T000000-00001.tfrecord"  # another replica's is not ours
    other_host.write_bytes(frame(b"theirs"))
    writer = TrafficWriter(tmp_path / "cap", limits)
    for i in range(40):
        writer.submit(payload(i))
    writer.close()
    assert not earlier.exists() and other_host.exists()
    other_host.unlink()
    files = list(tmp_path.glob("*.tfrecord"))
    assert all(p.stat().st_size <= limits.max_file_bytes for p in files)
    assert sum(p.stat().st_size for p in files) <= limits.max_total_bytes
    kept = records_in(tmp_path)
    assert kept == [payload(i) for i in range(40 - len(kept), 40)] and len(kept) >= 7  # the newest, in order


@pytest.mark.unit
def test_a_stuck_volume_drops_and_counts_without_holding_the_caller(tmp_path):
    entered, release = threading.Event(), threading.Event()

    def stuck() -> bytes:  # the writer thread hangs here, as on a hung volume
        entered.set()
        release.wait()
        return payload(0)

    writer = TrafficWriter(tmp_path / "cap", WriterLimits(queue_records=8))
    writer.submit(stuck)
    assert entered.wait(30)
    accepted = [writer.submit(payload(i)) for i in range(1, 14)]
    assert accepted == [True] * 8 + [False] * 5  # submit returned each time: nothing waited for the volume
    assert writer.dropped[QUEUE_FULL] == 5
    release.set()
    writer.close()
    assert records_in(tmp_path) == [payload(i) for i in range(9)]


@pytest.mark.unit
def test_an_unwritable_directory_and_a_broken_encoder_drop_and_count(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    writer = TrafficWriter(tmp_path / "file" / "captures" / "cap")
    for i in range(5):
        assert writer.submit(payload(i))
    writer.submit(lambda: 1 / 0)
    writer.close()
    assert writer.written == 0
    assert writer.dropped[WRITE_ERROR] == 5 and writer.dropped[ENCODE_ERROR] == 1


@pytest.mark.unit
@pytest.mark.parametrize(
    "limits",
    [WriterLimits(max_file_mb=0), WriterLimits(max_file_mb=10, max_total_mb=5), WriterLimits(queue_records=0)],
    ids=str,
)
def test_limits_are_checked(limits):
    with pytest.raises(TrainserveError, match="expected"):
        TrafficWriter("cap", limits)


WRITE_FOREVER = """
import itertools, sys
from trainserve.traffic.records import log_metadata, prediction_log, request_id
from trainserve.traffic.writer import TrafficWriter
writer = TrafficWriter(sys.argv[1])
for i in itertools.count():
    while not writer.submit(f"record {i:09d} ".encode() * 50):
        pass
"""


@pytest.mark.integration
def test_sigkill_mid_write_leaves_every_record_but_the_last(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITE_FOREVER, str(tmp_path / "cap")])
    try:
        deadline = time.monotonic() + 60
        while sum(p.stat().st_size for p in tmp_path.glob("*.tfrecord")) < 2_000_000:
            assert proc.poll() is None and time.monotonic() < deadline, "the writer did not write"
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()
    (path,) = tmp_path.glob("*.tfrecord")
    kept: list[bytes] = []
    with open(path, "rb") as stream:
        try:
            kept.extend(iter_records(stream))
        except DamagedRecord as damage:  # the record being written when it died, and nothing before it
            assert damage.offset == sum(len(frame(r)) for r in kept)
    assert len(kept) > 1000
    assert kept == [f"record {i:09d} ".encode() * 50 for i in range(len(kept))]


FULL_DISK = """
import resource, signal, sys
from trainserve.traffic.records import log_metadata, prediction_log, request_id
from trainserve.traffic.writer import TrafficWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (5000, 5000))
writer = TrafficWriter(sys.argv[1])
accepted = sum(writer.submit(b"x" * 900) for _ in range(40))
writer.close()
print(accepted, writer.written, writer.dropped["write_error"])
"""


@pytest.mark.integration
def test_a_full_disk_drops_and_counts_and_leaves_whole_records(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path / "cap")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    accepted, written, dropped = map(int, proc.stdout.split())
    assert accepted == 40 and written + dropped == 40 and dropped >= 1 and written >= 5
    assert len(records_in(tmp_path)) == written  # cut back to whole records: no file is damaged


@pytest.mark.unit
@pytest.mark.parametrize("version", [0, 7, None], ids=["version-0", "version-7", "no-version"])
def test_a_record_is_tf_servings_own_prediction_log_with_the_wire_bytes_inside(version):
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.inputs["x"].float_val.extend([1.5, 2.5])
    response = predict_pb2.PredictResponse()
    response.outputs["y"].int64_val.append(3)
    metadata = log_metadata("m", version, "serving_default", 0.25, request_id(None), timestamp=1_700_000_000.7)
    data = prediction_log(metadata, request.SerializeToString(), response.SerializeToString())

    log = prediction_log_pb2.PredictionLog.FromString(data)
    assert log.WhichOneof("log_type") == "predict_log"
    assert log.predict_log.request == request and log.predict_log.response == response
    spec = log.log_metadata.model_spec
    assert (spec.name, spec.signature_name, spec.HasField("version")) == ("m", "serving_default", version is not None)
    assert spec.version.value == (version or 0)
    assert log.log_metadata.sampling_config.sampling_rate == 0.25 and log.log_metadata.timestamp_secs == 1_700_000_000
    assert re.fullmatch(r"[0-9a-f]{32}", log.log_metadata.request_origin)
    assert request_id("client-42") == "client-42"
