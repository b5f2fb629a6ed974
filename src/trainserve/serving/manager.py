"""Which model versions are loaded, as TF Serving's file-system source and manager decide it
(sources/storage_path/file_system_storage_path_source.cc, core/aspired_versions_manager.cc).

Per model: scan `base_path` for numeric version directories, pick the aspired ones by the version
policy (`latest {n}`, `all`, `specific`), load new ones (replaying warmup) before unloading old ones,
keep serving the old when a new one fails, and track each version's state for GetModelStatus.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainserve.errors import TrainserveError, first_line
from trainserve.layout import is_version_dir, read_warmup_inputs
from trainserve.protos.get_model_status_pb2 import ModelVersionStatus
from trainserve.savedmodel import LoadedModel

log = logging.getLogger(__name__)

# The proto's own enum (apis/get_model_status.proto), so GetModelStatus sends the state as it is and
# REST prints its name: one source for the codes and their names.
State = ModelVersionStatus.State


class NotFound(TrainserveError):
    """Unknown model or version: gRPC NOT_FOUND, HTTP 404."""


class UnknownLabel(TrainserveError):
    """A label the config does not define: gRPC INVALID_ARGUMENT, HTTP 400, as TF Serving answers it
    (ServerCore::GetModelVersionForLabel in model_servers/server_core.cc)."""


@dataclass
class VersionState:
    version: int
    state: int = State.START  # a ModelVersionStatus.State value
    error_message: str = ""
    model: LoadedModel | None = None

    @property
    def error_code(self) -> str:
        return "UNKNOWN" if self.error_message else "OK"


@dataclass(frozen=True)
class ServableHandle:
    """A loaded version as one request holds it, as TF Serving's ServableHandle (core/servable_handle.h):
    the model stays usable for as long as the request holds the handle, even when the version unloads
    meanwhile; its session closes once the last holder lets go."""

    version: int
    model: LoadedModel


@dataclass
class ServedModel:
    """One configured model: where its versions are, which to serve, and their states."""

    name: str
    base_path: Path
    policy: str = "latest"
    num_versions: int = 1
    specific: frozenset[int] = frozenset()
    labels: dict[str, int] = field(default_factory=dict)
    versions: dict[int, VersionState] = field(default_factory=dict)
    failed_dirs: dict[int, float] = field(default_factory=dict)  # version -> mtime of the failed attempt
    waiting_reason: str = ""  # logged once each time it changes

    @classmethod
    def from_proto(cls, config) -> ServedModel:
        policy = config.model_version_policy
        kind = policy.WhichOneof("policy_choice") or "latest"
        return cls(
            name=config.name,
            base_path=Path(config.base_path),
            policy=kind,
            num_versions=(policy.latest.num_versions or 1) if kind == "latest" else 1,
            specific=frozenset(policy.specific.versions) if kind == "specific" else frozenset(),
            labels=dict(config.version_labels),
        )

    def on_disk(self) -> dict[int, float]:
        """Numeric version directories and their mtimes; non-numeric ones are skipped, as TF Serving does."""
        try:
            return {int(p.name): p.stat().st_mtime for p in self.base_path.iterdir() if is_version_dir(p)}
        except (FileNotFoundError, NotADirectoryError):
            return {}

    def aspired(self, on_disk: dict[int, float]) -> set[int]:
        candidates = sorted(v for v, mtime in on_disk.items() if self.failed_dirs.get(v) != mtime)
        if self.policy == "all":
            return set(candidates)
        if self.policy == "specific":
            return set(candidates) & self.specific
        return set(candidates[-self.num_versions :])

    def available(self) -> dict[int, VersionState]:
        # list(): a snapshot taken in one step, so the poller may add a version meanwhile.
        return {v: s for v, s in list(self.versions.items()) if s.state == State.AVAILABLE}

    def resolve(self, version: int | None = None, label: str | None = None) -> ServableHandle:
        """A handle on the version a request names (by number, label, or the newest available); NOT_FOUND,
        with TF Serving's message (core/basic_manager.cc), when that version is not served (any more)."""
        if label:
            if label not in self.labels:
                raise UnknownLabel(f"Unrecognized servable version label: {label}")
            version = self.labels[label]
        available = self.available()
        state = available.get(max(available, default=None) if version is None else version)
        # Read once: an unload after this line leaves the request its model; one before it is a miss.
        model = state.model if state is not None else None
        if model is None:
            wanted = f"Latest({self.name})" if version is None else f"Specific({self.name}, {version})"
            raise NotFound(f"Servable not found for request: {wanted}")
        return ServableHandle(state.version, model)


class ModelManager:
    """All served models; `poll()` brings loaded versions in line with disk and config."""

    def __init__(
        self,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        warmup: bool = True,
        allow_unavailable_labels: bool = False,
    ):
        # One thread changes this state (the poller, or the starting server before it); request threads
        # only read it, through snapshots (see ServedModel.available), so no lock is needed.
        self.models: dict[str, ServedModel] = {}
        self.intra_op_threads, self.inter_op_threads, self.warmup = intra_op_threads, inter_op_threads, warmup
        self.allow_unavailable_labels = allow_unavailable_labels
        # How a warmup record runs: on its version alone, unless Servables routes it through the batch threads.
        self.run_warmup: Callable[[LoadedModel, str, dict], object] = lambda loaded, signature, inputs: loaded.run(
            signature, inputs
        )

    def check_labels(self, config) -> None:
        """Refuse a config whose labels name versions not AVAILABLE now, as TF Serving does before it applies
        any of it (ServerCore::UpdateModelVersionLabelMap runs before the new policy reaches the source).

        With --allow_version_labels_for_unavailable_models a label that is new, or unchanged, may name any
        version; moving an existing label still needs its new version AVAILABLE. So a first config with
        labels starts only with that flag: nothing is loaded when it is checked.
        """
        for model in config.model_config_list.config:
            current = self.models.get(model.name)
            available = set(current.available()) if current else set()
            old_labels = current.labels if current else {}
            for label, version in sorted(model.version_labels.items()):
                if version in available:
                    continue
                if self.allow_unavailable_labels and old_labels.get(label, version) == version:
                    continue
                raise TrainserveError(
                    f"Request to assign label to version {version} of model {model.name}, which is not currently "
                    f"available for inference (label {label!r}; a label may only move to an AVAILABLE version: "
                    "load it first, then label it; at start, pass --allow_version_labels_for_unavailable_models)"
                )

    def configure(self, config) -> None:
        """Apply a ModelServerConfig: add new models, update policies and labels, drop removed models.
        Nothing changes when its labels are refused (check_labels)."""
        self.check_labels(config)
        wanted = {c.name: ServedModel.from_proto(c) for c in config.model_config_list.config}
        for name in set(self.models) - set(wanted):
            log.info("model %s removed from the config: unloading", name)
            for state in self.models.pop(name).available().values():
                self._unload(name, state)
        for name, fresh in wanted.items():
            current = self.models.get(name)
            if current is None:
                log.info("model %s: serving versions from %s (policy %s)", name, fresh.base_path, fresh.policy)
            else:  # new policy and labels, same loaded versions
                fresh.versions, fresh.failed_dirs = current.versions, current.failed_dirs
                fresh.waiting_reason = current.waiting_reason
            self.models[name] = fresh

    def get(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise NotFound(f"Servable not found for request: Latest({name})")
        return model

    def poll(self) -> None:
        for model in list(self.models.values()):
            self._poll_model(model)

    def _poll_model(self, model: ServedModel) -> None:
        on_disk = model.on_disk()
        reason = ""
        if not model.base_path.is_dir():
            reason = f"no version published yet: base path {model.base_path} does not exist; polling again"
        elif not on_disk:
            reason = f"no version published yet under {model.base_path}; waiting for a numeric version directory"
        if reason and reason != model.waiting_reason:
            log.warning("model %s: %s", model.name, reason)
        model.waiting_reason = reason
        aspired = model.aspired(on_disk)
        for version in sorted(aspired - set(model.available())):
            self._load(model, version, on_disk[version])
        # Availability preserving: unload only once what replaces it is AVAILABLE (or the dir is gone).
        loaded_aspired = set(model.available()) & aspired
        for version, state in list(model.available().items()):
            if version not in aspired and (loaded_aspired or version not in on_disk):
                self._unload(model.name, state)

    def _load(self, model: ServedModel, version: int, mtime: float) -> None:
        state = VersionState(version, State.LOADING)
        model.versions[version] = state
        log.info("model %s version %d: LOADING", model.name, version)
        started = time.perf_counter()
        try:
            loaded = LoadedModel(model.base_path / str(version), self.intra_op_threads, self.inter_op_threads)
            replayed = self._replay_warmup(loaded) if self.warmup else 0
        except Exception as exc:  # any failure is a failed load, reported in the status, never fatal
            message = first_line(exc)
            state.state, state.error_message = State.END, message
            model.failed_dirs[version] = mtime
            log.error("model %s version %d: load failed, END: %s", model.name, version, message)
            return
        state.model, state.state = loaded, State.AVAILABLE
        log.info(
            "model %s version %d: AVAILABLE (%.2f s, %d warmup request(s))",
            model.name,
            version,
            time.perf_counter() - started,
            replayed,
        )

    def _replay_warmup(self, loaded: LoadedModel) -> int:
        """Replay assets.extra/tf_serving_warmup_requests; any failing record fails the load."""
        requests = read_warmup_inputs(loaded.path)
        for index, (signature, inputs) in enumerate(requests):
            try:
                self.run_warmup(loaded, signature, inputs)
            except TrainserveError as exc:
                raise TrainserveError(f"warmup record {index} failed: {exc}") from None
        return len(requests)

    def _unload(self, name: str, state: VersionState) -> None:
        # Out of AVAILABLE first, so no new request resolves it; requests holding a ServableHandle finish on
        # it, and its session closes when the last of them lets go.
        log.info("model %s version %d: UNLOADING", name, state.version)
        state.state = State.UNLOADING
        state.model = None
        state.state = State.END
        log.info("model %s version %d: END", name, state.version)

    def wait_until_available(self, poll_seconds: float, stop: threading.Event) -> bool:
        """Block (polling) until every model has a version AVAILABLE, as TF Serving does at start."""
        while not stop.is_set():
            self.poll()
            if all(m.available() for m in self.models.values()):
                return True
            stop.wait(poll_seconds)
        return False

    def close(self) -> None:
        for model in self.models.values():
            for state in model.available().values():
                self._unload(model.name, state)
