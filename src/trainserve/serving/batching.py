"""Request batching as TF Serving's batching guide describes it (tensorflow_serving/batching/README.md,
batching/batching_session.cc, tensorflow/core/kernels/batching_util/shared_batch_scheduler.h).

One queue per key (model version, signature, output filter and the inputs' non-batch shapes); a queue
holds batches, the newest one open. A task joins the open batch while it fits in `max_batch_size`,
else it opens a new batch; a queue already holding `max_enqueued_batches` refuses it (UNAVAILABLE).
`num_batch_threads` threads, shared by all queues, take a batch once it is closed, full, or
`batch_timeout_micros` old; with a timeout of 0 a batch grows only while every thread is busy, which is
what makes batching pay on CPUs. A batch is concatenated along dim 0, padded to the next
`allowed_batch_sizes` entry with copies of its first row, run once, and split back to each caller.

Callers either block (`submit`, the REST threads) or await (`enqueue` with their event loop, the gRPC
front end): a waiting request then holds no thread, so nothing but `max_batch_size` caps a batch, and a
batch's answers reach the loop in one wake-up, not one per request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from trainserve.serving.config import Batching

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
RunFn = Callable[[Arrays], Arrays]
# (each task's size, the size run after padding): what the batching metrics record.
RecordFn = Callable[[list[int], int], None]


class QueueFull(Exception):
    """The task's queue already holds max_enqueued_batches batches: gRPC UNAVAILABLE, as in TF Serving."""


def task_size(inputs: Arrays) -> int | None:
    """Rows in a request, or None when it cannot be concatenated with others (a scalar input, inputs
    whose first dimensions differ, no rows): such a request runs alone."""
    sizes = {v.shape[0] if v.ndim else None for v in inputs.values()}
    if len(sizes) != 1 or None in sizes:
        return None
    size = sizes.pop()
    return size or None


def shape_key(inputs: Arrays) -> tuple:
    """What must match for requests to be concatenated: input names, dtypes and non-batch dimensions."""
    return tuple(sorted((k, v.dtype.str, v.shape[1:]) for k, v in inputs.items()))


@dataclass
class Task:
    inputs: Arrays
    size: int
    loop: asyncio.AbstractEventLoop | None = None  # the caller's loop when it awaits; None when it blocks
    future: Future | asyncio.Future = field(init=False)

    def __post_init__(self) -> None:
        self.future = Future() if self.loop is None else self.loop.create_future()


def settle(answers: list[tuple[Task, Arrays | BaseException]]) -> None:
    """Hand each task its outputs or its error: blocking callers directly, awaiting ones in one call on
    their loop per batch (each call_soon_threadsafe wakes the loop)."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for task, answer in answers:
        if task.loop is None:
            _set(task.future, answer)
        else:
            by_loop.setdefault(task.loop, []).append((task.future, answer))
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_all, pairs)
        except RuntimeError:  # the loop is closed: its callers are gone
            log.debug("dropped %d answer(s) for a closed event loop", len(pairs))


def _set(future, answer) -> None:
    if future.done():  # an awaiting caller that was cancelled (the client left)
        return
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)


def _set_all(pairs) -> None:
    for future, answer in pairs:
        _set(future, answer)


@dataclass
class Batch:
    tasks: list[Task] = field(default_factory=list)
    size: int = 0
    opened: float = field(default_factory=time.monotonic)


@dataclass
class TaskQueue:
    run: RunFn
    batches: deque[Batch] = field(default_factory=deque)

    def add(self, task: Task, max_batch_size: int, max_enqueued_batches: int) -> bool:
        """Join the open batch, or open one; True when that changed what a batch thread waits for (a new
        batch, hence a new deadline, or a full one)."""
        opened = not self.batches or self.batches[-1].size + task.size > max_batch_size
        if opened:
            if len(self.batches) >= max_enqueued_batches:
                raise QueueFull("The batch scheduling queue to which this task was submitted is full")
            self.batches.append(Batch())
        batch = self.batches[-1]
        batch.tasks.append(task)
        batch.size += task.size
        return opened or batch.size >= max_batch_size


def padded_size(size: int, allowed: tuple[int, ...]) -> int:
    """The smallest allowed batch size that holds `size` rows (size itself when none are configured)."""
    return next((a for a in allowed if a >= size), size)


def merge(tasks: list[Task], padded: int) -> Arrays:
    """Concatenate every input along dim 0; pad with copies of the first row (a valid input, unlike
    zeros for some models), as batching_session.cc pads."""
    merged = {k: np.concatenate([t.inputs[k] for t in tasks]) for k in tasks[0].inputs}
    size = sum(t.size for t in tasks)
    if padded > size:
        merged = {k: np.concatenate([v, np.repeat(v[:1], padded - size, axis=0)]) for k, v in merged.items()}
    return merged


def split(outputs: Arrays, sizes: list[int], padded: int) -> list[Arrays] | None:
    """Each task's own rows of every output (padding dropped), or None when an output has no batch
    dimension to split along."""
    if any(v.ndim == 0 or v.shape[0] != padded for v in outputs.values()):
        return None
    bounds = np.cumsum([0, *sizes])
    return [{k: v[start:end] for k, v in outputs.items()} for start, end in zip(bounds[:-1], bounds[1:])]


class BatchScheduler:
    """Queues keyed by the caller, a shared pool of batch threads, and a drain for shutdown."""

    def __init__(self, options: Batching, record: RecordFn | None = None):
        self.options = options
        self._record = record or (lambda sizes, processed: None)
        self._queues: dict[Hashable, TaskQueue] = {}
        self._cond = threading.Condition()
        self._closing = False
        count = options.num_batch_threads or len(os.sched_getaffinity(0))
        self._threads = [threading.Thread(target=self._work, name=f"batch-{i}", daemon=True) for i in range(count)]
        for thread in self._threads:
            thread.start()

    def submit(self, key: Hashable, run: RunFn, inputs: Arrays, size: int) -> Arrays:
        """Queue the request and block until its batch ran; returns its rows of every output."""
        task = self.enqueue(key, run, inputs, size)
        if task is None:  # after the drain began no batch thread may be left to take it
            return run(inputs)
        return task.future.result()

    def enqueue(
        self, key: Hashable, run: RunFn, inputs: Arrays, size: int, loop: asyncio.AbstractEventLoop | None = None
    ) -> Task | None:
        """Queue the request without waiting; its `future` (an asyncio one on `loop` when given) gets its
        rows of every output. None once the drain began: the caller runs it alone."""
        task = Task(inputs, size, loop)
        with self._cond:
            if self._closing:
                return None
            queue = self._queues.setdefault(key, TaskQueue(run))
            if queue.add(task, self.options.max_batch_size, self.options.max_enqueued_batches):
                # Only then: a thread already waiting for this batch's deadline would wake for nothing,
                # and each such wake-up takes the GIL from the request path.
                self._cond.notify()
        return task

    def close(self) -> None:
        """Drain: every queued batch runs now (timeouts no longer wait), then the threads end."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        while True:
            with self._cond:
                taken = self._take_ready()
                while taken is None:
                    if self._closing and not self._queues:
                        return
                    self._cond.wait(self._until_next_deadline())
                    taken = self._take_ready()
            self._process(*taken)

    def _is_ready(self, queue: TaskQueue, now: float) -> bool:
        head = queue.batches[0]
        return (
            self._closing
            or len(queue.batches) > 1  # a newer batch exists: this one is closed
            or head.size >= self.options.max_batch_size
            or now - head.opened >= self.options.batch_timeout_micros / 1e6
        )

    def _take_ready(self) -> tuple[TaskQueue, Batch] | None:
        """The oldest ready head batch of any queue (oldest first keeps queues fair); empty queues go."""
        now = time.monotonic()
        ready = [(q.batches[0].opened, k) for k, q in self._queues.items() if self._is_ready(q, now)]
        if not ready:
            return None
        key = min(ready, key=lambda r: r[0])[1]
        queue = self._queues[key]
        batch = queue.batches.popleft()
        if not queue.batches:
            del self._queues[key]
        return queue, batch

    def _until_next_deadline(self) -> float | None:
        if not self._queues:
            return None  # nothing queued: sleep until submit() notifies
        timeout = self.options.batch_timeout_micros / 1e6
        oldest = min(q.batches[0].opened for q in self._queues.values())
        return max(0.0, oldest + timeout - time.monotonic())

    def _process(self, queue: TaskQueue, batch: Batch) -> None:
        settle(list(zip(batch.tasks, self._answers(queue.run, batch))))

    def _answers(self, run: RunFn, batch: Batch) -> list[Arrays | BaseException]:
        """Each task's rows of the batch's outputs, or the error that answers it."""
        padded = padded_size(batch.size, self.options.allowed_batch_sizes)
        try:
            outputs = run(merge(batch.tasks, padded))
        except Exception as exc:  # the run's own error (a ServingError) goes to every caller
            return [exc] * len(batch.tasks)
        sizes = [t.size for t in batch.tasks]
        self._record(sizes, padded)
        parts = split(outputs, sizes, padded)
        if parts is not None:
            return parts
        if len(batch.tasks) == 1 and padded == batch.size:
            return [outputs]
        # An output without a batch dimension (a sum over the batch, say) cannot be split: answer each
        # caller from its own run, so batching never changes an answer.
        return [_run_alone(run, task.inputs) for task in batch.tasks]


def _run_alone(run: RunFn, inputs: Arrays) -> Arrays | BaseException:
    try:
        return run(inputs)
    except Exception as exc:
        return exc
