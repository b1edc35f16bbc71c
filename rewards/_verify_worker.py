"""The client of the killable sympy worker process for rewards.verify, and the frame protocol both sides speak.

sympy can block for a long time inside C-level big-integer code, where signal.alarm cannot
interrupt it, so every sympy step runs in a child process that the caller kills when a call
runs past its deadline.  The child is a plain `python -m rewards._sympy_child` subprocess (no
multiprocessing, so it never re-imports the caller's __main__) speaking length-prefixed pickles
(read_exact / write_frame below) over its stdin/stdout.  Only node trees built by rewards.mathparse
cross the pipe; the child builds sympy objects from them with sympy constructors, never from text.
This module imports no sympy: only the child does (rewards/_sympy_child.py).

Client side: `SympyWorker().confirm(op, a, b, timeout)` -> True | False | None (None: unknown,
timed out or crashed).  Each process lazily owns one worker (re-created after fork), which is
shut down at interpreter exit.
"""
from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time

HEADER = struct.Struct("<I")
MAX_FRAME = 1 << 20
MEMORY_LIMIT = 2 << 30  # bytes of address space for the child
READY = "ready"


# ---------------------------------------------------------------------------------------------
# the frame protocol (both sides)

def read_exact(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def write_frame(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    payload = HEADER.pack(len(data)) + data
    while payload:
        payload = payload[os.write(fd, payload):]


# ---------------------------------------------------------------------------------------------
# parent side

class SympyWorker:
    """One child process per parent process; thread-safe; restarted after a kill or a crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = -1
        self._ready = False
        self._buf = b""
        self._next_id = 0
        self.restarts = 0

    # -- process management
    def _spawn(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "rewards._sympy_child"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0, close_fds=True, env=env,
            cwd=root)
        self._owner = os.getpid()
        self._ready = False
        self._buf = b""

    def _ensure(self) -> None:
        if self._owner != os.getpid():  # forked child: the parent's worker is not ours
            self._proc = None
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                self.restarts += 1
            self._spawn()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and self._owner == os.getpid():
            try:
                proc.kill()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._ready = False
        self._buf = b""

    def start(self) -> None:
        """Starts the child now (it imports sympy in the background)."""
        with self._lock:
            self._ensure()

    def shutdown(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is None or self._owner != os.getpid():
                return
            try:
                proc.stdin.close()
                proc.wait(timeout=1)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    # -- framing with a deadline
    def _read_frame(self, deadline: float):
        fd = self._proc.stdout.fileno()
        while True:
            if len(self._buf) >= HEADER.size:
                (size,) = HEADER.unpack(self._buf[:HEADER.size])
                if len(self._buf) >= HEADER.size + size:
                    data = self._buf[HEADER.size:HEADER.size + size]
                    self._buf = self._buf[HEADER.size + size:]
                    return pickle.loads(data)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError
            self._buf += chunk

    def confirm(self, op: str, a, b, timeout: float):
        """Asks sympy; returns True/False/None.  Kills and restarts the child on timeout."""
        deadline = time.monotonic() + max(timeout, 0.0)
        if not self._lock.acquire(timeout=max(timeout, 0.0)):
            return None
        try:
            self._ensure()
            try:
                if not self._ready:
                    tag, _ = self._read_frame(deadline)
                    self._ready = tag == READY
                self._next_id += 1
                req_id = self._next_id
                write_frame(self._proc.stdin.fileno(), (req_id, op, a, b))
                while True:
                    got_id, result = self._read_frame(deadline)
                    if got_id == req_id:
                        return result
            except TimeoutError:
                if self._ready:  # stuck inside sympy: kill it and start a fresh one
                    self._kill()
                    self._spawn()
                    self.restarts += 1
                return None
            except (EOFError, OSError, pickle.PickleError, ValueError):
                self._kill()
                return None
        finally:
            self._lock.release()


_WORKER = SympyWorker()
atexit.register(_WORKER.shutdown)


def get_worker() -> SympyWorker:
    return _WORKER

