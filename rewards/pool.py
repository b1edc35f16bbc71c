"""A pool of reward worker processes: score batches of (text, gold) pairs in parallel, robustly.

    from rewards.pool import RewardPool
    with RewardPool(n_workers=2, timeout=5.0, cfg=RewardConfig(w_process=0.2)) as pool:
        handle = pool.submit_batch(texts, golds)        # returns at once; sampling can go on meanwhile
        ...
        scores = handle.result()                        # list of rewards.combine.score dicts, in order
        scores = pool.score_batch(texts, golds, n_tokens=lengths)   # the blocking form
        pool.stats()["pairs_per_s"]

Robustness: each item runs under a wall-clock deadline (`timeout` seconds, from the moment a worker starts
it). An item whose worker crashes (segfault, MemoryError during unpickling, os._exit) or runs past its
deadline gets rewards.combine.error_result ("crash" / "timeout": total 0, error=1); the stuck worker's whole
process group (it and any sympy child of rewards.verify) is SIGKILLed and replaced, and the other items of
its chunk are re-queued, so one item never stops the batch. A worker that cannot start (3 failures in a row
while none is ready) fails the queued items with "no_worker" rather than hanging.

Input cap: a text or gold longer than `max_text_chars` (default 1,000,000 characters) gets error "too_long"
and is never sent (no pickling, no worker time). Below that, rewards.combine.score looks only at the last
RewardConfig.max_chars characters, so an item at the cap costs well under the default 5 s deadline (about
0.8 s for 1M characters of step lines, the costliest text measured; see docs/security.md).

Clean-up: each worker has its own temporary directory (TMPDIR), where the code sandbox makes its run
directories; the parent removes it whenever it kills, replaces or retires the worker, so an item killed at its
deadline leaves nothing on disk (what a still-dying process writes meanwhile is removed on the next pass). The
directories are named after the pool owner's pid, and a new pool removes those whose owner is gone (what a
SIGKILLed trainer left).

Dying with the trainer: each worker asks the kernel to SIGKILL it when its parent exits (PR_SET_PDEATHSIG)
and drops its copy of the forkserver's "alive" pipe, so a SIGKILLed trainer takes the forkserver, every
worker (even one stuck in C code) and their sympy children with it within moments (rewards/_lifeline.py).

Processes: workers start with the "forkserver" (default) or "spawn" method, never plain fork, because the
parent holds JAX threads. With forkserver, rewards.combine is preloaded in the fork server so a replacement
worker starts in milliseconds (this sets the process-wide forkserver preload list if the server is not yet
running). Each worker puts itself in its own process group, ignores SIGINT (the parent decides), limits its
address space to `memory_limit_mb`, and warms the sympy child of rewards.verify up before taking work.

score_fn (default rewards.combine.score) must be a module-level function with score's signature, so the
workers can import it; tests use it to inject hangs and crashes.

The main script must be import-safe (`if __name__ == "__main__":`), as for any spawn / forkserver pool.

Scheduling: one manager thread hands each idle worker a chunk of items (chunk size adapts to the queue,
at most `max_chunk`); the worker returns the chunk's results in one message and publishes the item it is
working on, and since when, in shared memory, which is what the per-item deadline is measured against.
n_workers=0 scores in the calling thread (no timeouts; for debugging).

stats(): items, errors, timeouts, crashes, too_long, restarts, busy_s (wall time with work pending),
pairs_per_s (items / busy_s), last_batch_pairs_per_s, workers_alive.
"""
from __future__ import annotations

import collections
import math
import multiprocessing as mp
import os
import resource
import shutil
import signal
import tempfile
import threading
import time
from multiprocessing import forkserver
from multiprocessing.connection import wait as mp_wait

from rewards._lifeline import die_with_parent, release_forkserver_lifeline
from rewards.combine import RewardConfig, error_result, gold_text, score
from rewards.parse import as_text
from rewards.verify import warmup

__all__ = ["RewardPool", "BatchHandle"]

_START_METHODS = ("forkserver", "spawn")
_TMP_PREFIX = "reward-worker-"  # + the pool owner's pid: leftovers of a SIGKILLed owner are removed by the next pool
_READY = "ready"


def _worker_main(conn, progress, cfg, memory_limit_mb, score_fn, tmpdir):
    """Worker process: receive chunks [(job_id, text, gold, n_tokens)], send [(job_id, result), ...] per chunk.

    `progress` (shared doubles) holds [current job id, its start time on the monotonic clock], so the parent
    knows which item is running and since when without a message per item. `tmpdir` is this worker's own
    temporary directory (the code sandbox's run directories go there), which the parent removes when it kills
    or retires the worker."""
    os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = tmpdir
    die_with_parent()  # the kernel kills a hung worker when its parent (the forkserver or the trainer) exits
    release_forkserver_lifeline()  # ... and lets the forkserver exit when the trainer does
    try:
        os.setpgid(0, 0)  # own process group: the parent kills it together with its sympy child
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if memory_limit_mb:
        limit = int(memory_limit_mb) << 20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        warmup()  # start the sympy child now, not inside the first item's time budget
    except Exception:  # noqa: BLE001 - scoring still works; symbolic checks just start later
        pass
    conn.send((_READY, os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        results = []
        for job_id, text, gold, n_tokens in msg:
            progress[1] = time.monotonic()
            progress[0] = job_id
            try:
                result = score_fn(text, gold, cfg, n_tokens=n_tokens)
            except Exception as e:  # noqa: BLE001 - a custom score_fn may raise; combine.score never does
                result = error_result(type(e).__name__)
            results.append((job_id, result))
        progress[0] = 0.0
        conn.send(results)


class BatchHandle:
    """Future-like result of submit_batch: .done(), .result(timeout=None) -> list[dict] in input order."""

    def __init__(self, n: int):
        self._results: list[dict | None] = [None] * n
        self._left = n
        self._event = threading.Event()
        self._lock = threading.Lock()
        self.submitted_at = time.monotonic()
        self.finished_at: float | None = None
        if n == 0:
            self._finish()

    def _finish(self):
        self.finished_at = time.monotonic()
        self._event.set()

    def _set(self, index: int, result: dict) -> bool:
        """Store one result; True when this completed the batch."""
        with self._lock:
            if self._results[index] is not None:
                return False
            self._results[index] = result
            self._left -= 1
            if self._left == 0:
                self._finish()
                return True
            return False

    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout: float | None = None) -> list[dict]:
        if not self._event.wait(timeout):
            raise TimeoutError(f"batch not scored within {timeout} s")
        return list(self._results)


class _Worker:
    def __init__(self, ctx, cfg, memory_limit_mb, score_fn):
        self.conn, child = ctx.Pipe(duplex=True)
        self.progress = ctx.RawArray("d", 2)
        self.tmp = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-")
        os.chmod(self.tmp, 0o711)  # the sandbox's private uid must pass through to its own run directory
        self.proc = ctx.Process(target=_worker_main, args=(child, self.progress, cfg, memory_limit_mb, score_fn,
                                                           self.tmp), daemon=True, name="reward-worker")
        self.proc.start()
        child.close()
        self.ready = False
        self.started_at = time.monotonic()
        self.jobs: collections.deque[int] = collections.deque()  # outstanding job ids, in the worker's order
        self.last_seen = 0.0  # last time the manager saw this worker make progress

    def current(self) -> tuple[int, float]:
        """(job id it is working on or 0, that item's start time)."""
        job, start = self.progress[0], self.progress[1]
        return int(job), start

    def kill(self) -> bool:
        """SIGKILL the worker's process group and remove its temporary directory (what a killed code run left
        there); returns whether the directory is gone (a process of the run may still be writing for a moment)."""
        pid = self.proc.pid
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)  # the worker and its sympy child
            except (ProcessLookupError, PermissionError, OSError):
                pass
        try:
            self.proc.kill()
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=2)
        try:
            self.conn.close()
        except OSError:
            pass
        return _remove_tree(self.tmp)


class RewardPool:
    """Scores (text, gold) pairs in worker processes; see the module docstring."""

    def __init__(self, n_workers: int = 2, timeout: float | None = None, cfg: RewardConfig | None = None, *,
                 timeout_per_item: float | None = None, start_method: str = "forkserver", max_chunk: int = 32,
                 memory_limit_mb: int | None = 4096, startup_timeout: float = 60.0,
                 max_text_chars: int = 1_000_000, score_fn=score):
        if timeout is not None and timeout_per_item is not None and timeout != timeout_per_item:
            raise ValueError("RewardPool: give timeout or timeout_per_item, not two different values")
        timeout = timeout_per_item if timeout is None else timeout
        timeout = 5.0 if timeout is None else timeout
        if not isinstance(n_workers, int) or isinstance(n_workers, bool) or n_workers < 0:
            raise ValueError(f"RewardPool.n_workers must be an int >= 0, got {n_workers!r}")
        if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"RewardPool.timeout must be a positive number of seconds, got {timeout!r}")
        if start_method not in _START_METHODS:
            raise ValueError(f"RewardPool.start_method must be one of {_START_METHODS} (never plain fork: the "
                             f"parent has JAX threads), got {start_method!r}")
        if not isinstance(max_chunk, int) or max_chunk < 1:
            raise ValueError(f"RewardPool.max_chunk must be an int >= 1, got {max_chunk!r}")
        if cfg is not None and not isinstance(cfg, RewardConfig):
            raise ValueError(f"RewardPool.cfg must be a rewards.combine.RewardConfig, got {type(cfg).__name__}")
        if not isinstance(max_text_chars, int) or isinstance(max_text_chars, bool) or max_text_chars < 1:
            raise ValueError(f"RewardPool.max_text_chars must be an int >= 1, got {max_text_chars!r}")
        if not callable(score_fn):
            raise ValueError("RewardPool.score_fn must be a picklable module-level function (text, gold, cfg, n_tokens=)")
        self.score_fn = score_fn
        self.n_workers, self.timeout, self.cfg = n_workers, float(timeout), cfg or RewardConfig()
        if self.timeout <= self.cfg.verify_timeout:
            raise ValueError(f"RewardPool.timeout ({self.timeout} s) must exceed RewardConfig.verify_timeout "
                             f"({self.cfg.verify_timeout} s), or every slow answer check becomes a timeout")
        self.max_chunk, self.memory_limit_mb = max_chunk, memory_limit_mb
        self.startup_timeout, self.max_text_chars = float(startup_timeout), int(max_text_chars)
        self._stats = collections.Counter()
        self._busy_s = 0.0
        self._last_batch_rate = 0.0
        self._lock = threading.Lock()
        self._inbox: collections.deque = collections.deque()  # (handle, index, text, gold, n_tokens)
        self._closed = False
        self._thread = None
        if n_workers == 0:
            return
        _remove_orphaned_tmp()
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            if not getattr(forkserver._forkserver, "_forkserver_pid", None):  # not running yet
                self._ctx.set_forkserver_preload(["rewards.combine"])
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._workers: list[_Worker] = []
        self._queue: collections.deque = collections.deque()  # job ids waiting for a worker
        self._jobs: dict[int, tuple] = {}  # job id -> (handle, index, text, gold, n_tokens)
        self._next_id = 0
        self._start_failures = 0
        self._last_failure = 0.0
        self._leftover: list[str] = []  # temporary directories of killed workers not yet removed (retried)
        self._thread = threading.Thread(target=self._manager, name="reward-pool", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ public API
    def submit_batch(self, texts, golds, n_tokens=None) -> BatchHandle:
        """Queue a batch; returns a handle at once (handle.result() waits)."""
        # Only str / bytes cross the process boundary (anything else scores as empty text, as in score()).
        texts = [t if isinstance(t, (str, bytes)) else as_text(t) for t in list(texts)]
        golds = [g if isinstance(g, (str, bytes)) else gold_text(g) for g in list(golds)]
        if len(texts) != len(golds):
            raise ValueError(f"RewardPool: texts ({len(texts)}) and golds ({len(golds)}) differ in length")
        toks = [None] * len(texts) if n_tokens is None else [_as_int(t) for t in list(n_tokens)]
        if len(toks) != len(texts):
            raise ValueError(f"RewardPool: n_tokens ({len(toks)}) and texts ({len(texts)}) differ in length")
        if self._closed:
            raise RuntimeError("RewardPool is closed")
        handle = BatchHandle(len(texts))
        if self.n_workers == 0:
            for i, (t, g, n) in enumerate(zip(texts, golds, toks)):
                self._record(handle, i, self._too_long(t, g) or self._inline(t, g, n))
            return handle
        with self._lock:
            for i, (t, g, n) in enumerate(zip(texts, golds, toks)):
                self._inbox.append((handle, i, t, g, n))
        self._wake()
        return handle

    def score_batch(self, texts, golds, n_tokens=None) -> list[dict]:
        """Score a batch and wait for it: one rewards.combine.score dict per pair, in order."""
        return self.submit_batch(texts, golds, n_tokens).result()

    def stats(self) -> dict:
        with self._lock:
            s = {k: int(self._stats[k]) for k in ("items", "errors", "timeouts", "crashes", "too_long", "restarts",
                                                   "no_worker", "manager_errors")}
            s["busy_s"] = self._busy_s
            s["pairs_per_s"] = s["items"] / self._busy_s if self._busy_s > 0 else 0.0
            s["last_batch_pairs_per_s"] = self._last_batch_rate
        s["workers_alive"] = 0 if self.n_workers == 0 else sum(1 for w in list(self._workers) if w.proc.is_alive())
        return s

    def close(self) -> None:
        """Stop the manager and the workers; unfinished items get error "closed"."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return
        self._wake()
        self._thread.join(timeout=10)
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 2.0
        for w in self._workers:
            w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if not w.kill():
                self._leftover.append(w.tmp)
        self._workers = []
        self._leftover = [d for d in self._leftover if not _remove_tree(d)]
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------------------------------ internals
    def _inline(self, text, gold, n_tokens):
        try:
            return self.score_fn(text, gold, self.cfg, n_tokens=n_tokens)
        except Exception as e:  # noqa: BLE001
            return error_result(type(e).__name__)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (each is also its process group id)."""
        return [w.proc.pid for w in list(getattr(self, "_workers", [])) if w.proc.is_alive()]

    def _too_long(self, text, gold=None):
        """The input cap, applied before anything is sent to a worker (see the module docstring)."""
        for s in (text, gold):
            if isinstance(s, (str, bytes, bytearray)) and len(s) > self.max_text_chars:
                return error_result("too_long")
        return None

    def _record(self, handle: BatchHandle, index: int, result: dict) -> None:
        with self._lock:
            self._stats["items"] += 1
            if result.get("error"):
                self._stats["errors"] += 1
                kind = result.get("error_kind", "")
                if kind in ("timeout", "crash", "too_long", "no_worker"):
                    self._stats[{"timeout": "timeouts", "crash": "crashes"}.get(kind, kind)] += 1
        if handle._set(index, result):
            elapsed = max(handle.finished_at - handle.submitted_at, 1e-9)
            with self._lock:
                self._last_batch_rate = len(handle._results) / elapsed
                if self.n_workers == 0:
                    self._busy_s += elapsed

    def _wake(self):
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _manager(self):
        while True:
            t0 = time.monotonic()
            had_work = bool(self._jobs)
            try:
                if self._closed:
                    self._fail_all("closed")
                    return
                self._take_inbox()
                had_work = had_work or bool(self._jobs)
                self._keep_workers()
                self._dispatch()
                self._wait_and_collect()
                self._check_deadlines()
            except Exception:  # noqa: BLE001 - the manager must survive anything
                with self._lock:
                    self._stats["manager_errors"] += 1
                time.sleep(0.01)
            if had_work:
                with self._lock:
                    self._busy_s += time.monotonic() - t0

    def _take_inbox(self):
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
        for handle, index, text, gold, n in items:
            early = self._too_long(text, gold)
            if early is not None:
                self._record(handle, index, early)
                continue
            self._next_id += 1
            self._jobs[self._next_id] = (handle, index, text, gold, n)
            self._queue.append(self._next_id)

    def _keep_workers(self):
        self._leftover = [d for d in self._leftover if not _remove_tree(d)]
        for w in list(self._workers):
            if not w.proc.is_alive():
                self._drain(w)  # collects its last results, then fails its current item
        # After start failures, back off a little so a broken environment does not spin creating processes.
        if self._start_failures and time.monotonic() - self._last_failure < min(5.0, 0.2 * self._start_failures):
            pass
        else:
            while len(self._workers) < self.n_workers:
                self._workers.append(_Worker(self._ctx, self.cfg, self.memory_limit_mb, self.score_fn))
        if self._queue and self._start_failures >= 3 and not any(w.ready for w in self._workers):
            while self._queue:  # workers cannot start: fail loudly per item instead of hanging
                self._finish_job(self._queue.popleft(), error_result("no_worker"))
            self._start_failures = 0

    def _dispatch(self):
        idle = [w for w in self._workers if w.ready and not w.jobs]
        for w in idle:
            if not self._queue:
                return
            size = max(1, min(self.max_chunk, math.ceil(len(self._queue) / (2 * max(1, self.n_workers)))))
            ids = [self._queue.popleft() for _ in range(min(size, len(self._queue)))]
            chunk = [(j, *self._jobs[j][2:]) for j in ids]
            w.jobs.extend(ids)
            w.last_seen = time.monotonic()
            try:
                w.conn.send(chunk)
            except (OSError, ValueError, BrokenPipeError, MemoryError):
                self._worker_died(w, "crash")

    def _wait_and_collect(self):
        now = time.monotonic()
        deadlines = [self._deadline(w) for w in self._workers if w.jobs]
        deadlines += [w.started_at + self.startup_timeout for w in self._workers if not w.ready]
        wait_s = min([0.5] + [max(0.0, d - now) for d in deadlines])
        objs = [self._wake_r] + [w.conn for w in self._workers] + [w.proc.sentinel for w in self._workers]
        ready = set(mp_wait(objs, timeout=wait_s))
        if self._wake_r in ready:
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass
        for w in list(self._workers):
            if w.conn in ready or w.proc.sentinel in ready:
                self._drain(w)

    def _drain(self, w: _Worker):
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if isinstance(msg, tuple) and msg[0] == _READY:
                    w.ready = True
                    self._start_failures = 0
                    continue
                w.last_seen = time.monotonic()
                for job_id, result in msg:
                    try:
                        w.jobs.remove(job_id)
                    except ValueError:
                        continue  # not ours (already failed or re-queued): drop
                    self._finish_job(job_id, result)
        except (EOFError, OSError, ValueError, TypeError, IndexError):
            self._worker_died(w, "crash")
            return
        if not w.proc.is_alive():
            self._worker_died(w, "crash")

    def _deadline(self, w: _Worker) -> float:
        """When the worker's current item runs out of time. Without a current item (chunk not started yet,
        or results in flight), when it has shown no progress for `timeout` seconds."""
        job, start = w.current()
        if job and job in self._jobs:
            return start + self.timeout
        return w.last_seen + self.timeout

    def _check_deadlines(self):
        now = time.monotonic()
        for w in list(self._workers):
            if w.jobs and now > self._deadline(w):
                self._drain(w)  # results may have arrived just now
                if w in self._workers and w.jobs and now > self._deadline(w):
                    self._worker_died(w, "timeout")
            elif not w.ready and now - w.started_at > self.startup_timeout:
                self._worker_died(w, "crash")

    def _worker_died(self, w: _Worker, kind: str):
        if w not in self._workers:
            return
        if not w.ready:
            self._start_failures += 1
            self._last_failure = time.monotonic()
        job, _ = w.current()
        if not w.kill():
            self._leftover.append(w.tmp)
        self._workers.remove(w)
        with self._lock:
            self._stats["restarts"] += 1
        if w.jobs:
            # Blame the item it was working on (the first of its chunk if it had not started one) and give
            # the rest of its chunk to another worker.
            blamed = job if job in w.jobs else w.jobs[0]
            w.jobs.remove(blamed)
            self._finish_job(blamed, error_result(kind))
            self._queue.extendleft(reversed(w.jobs))
            w.jobs.clear()

    def _finish_job(self, job_id: int, result: dict):
        job = self._jobs.pop(job_id, None)
        if job is not None:
            self._record(job[0], job[1], result)

    def _fail_all(self, kind: str):
        for job_id in list(self._jobs):
            self._finish_job(job_id, error_result(kind))
        self._queue.clear()
        with self._lock:
            items = list(self._inbox)
            self._inbox.clear()
        for handle, index, *_ in items:
            self._record(handle, index, error_result(kind))


def _remove_orphaned_tmp() -> None:
    """Worker directories whose pool owner no longer exists (a SIGKILLed trainer cannot clean up after itself)."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        owner = name[len(_TMP_PREFIX):].split("-", 1)[0]
        if not name.startswith(_TMP_PREFIX) or not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            _remove_tree(os.path.join(root, name))
        except (PermissionError, OverflowError, OSError):
            continue  # alive (another user's) or not a pid: left alone


def _remove_tree(path: str) -> bool:
    """Remove a directory tree; whether it is gone."""
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def _as_int(x):
    try:
        return None if x is None else int(x)
    except (TypeError, ValueError, OverflowError):
        return None
