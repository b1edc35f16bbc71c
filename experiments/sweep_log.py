"""What a sweep prints while its launchers run: a live one-line status, and the error a failed launcher left.

    with Status(jobs) as status:      # jobs: {"label", "workdir", "units" (optional)}
        status.say("start ...")        # a line above the status line
        status.started(job); ...; status.ended(job)
    error_of("runs/sw/p/seed0/launch.log")   # "config error: 2 problems:\n  tasks.n_test: ...\n  eval.n_val: ..."

experiments/sweep.py uses both: a `start` line with each run's log path as it starts, the status line while runs
go, and each failed run's whole error on its end line.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time

STATUS_SECONDS = 60.0  # the status line's period when stdout is not a terminal (a log file)
_ERROR_START = re.compile(r"^(config error|sweep error|error|[\w.]*(Error|Exception|Interrupt|Exit))\b")


def error_of(log: str, max_lines: int = 40) -> str:
    """The whole error a failed launcher left at the end of its log: from the last line that opens an error
    ("config error: ...", "ValueError: ...", every line of a multi-line message) to the end; else the last line."""
    with open(log, encoding="utf-8", errors="replace") as f:
        lines = [ln.rstrip() for ln in f if ln.strip()]
    start = next((i for i in range(len(lines) - 1, -1, -1) if _ERROR_START.match(lines[i])), len(lines) - 1)
    return "\n".join(lines[max(start, len(lines) - max_lines):]) if lines else "(empty log)"


class Status:
    """The sweep's live status while launchers run: one line, "sweep 3/8 done, 2 running: a seed0 unit 12/40,
    ...", redrawn in place every second on a terminal and printed every STATUS_SECONDS otherwise (a log file gets
    no carriage returns). A running job's unit is the last `step` of its metrics.jsonl (global units, of
    job["units"] when known). `say` prints a line above the status line."""

    def __init__(self, jobs: list[dict], stream=None, period: float | None = None):
        self.jobs, self.stream = jobs, stream or sys.stdout
        self.tty = self.stream.isatty()
        self.period = period if period is not None else (1.0 if self.tty else STATUS_SECONDS)
        self.running: list[dict] = []
        self.done, self.t0, self.shown = 0, time.time(), False
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        with self.lock:
            self._clear()

    def started(self, j):
        with self.lock:
            self.running.append(j)

    def ended(self, j):
        with self.lock:
            self.running = [r for r in self.running if r is not j]
            self.done += 1

    def line(self) -> str:
        parts = []
        for j in self.running:
            u = last_step(os.path.join(j["workdir"], "metrics.jsonl"))
            parts.append(f"{j['label']} " + ("starting" if u is None else f"unit {u}" +
                                             (f"/{j['units']}" if j.get("units") else "")))
        return (f"[sweep {time.time() - self.t0:6.0f} s] {self.done}/{len(self.jobs)} done, {len(self.running)} "
                f"running" + (": " + ", ".join(parts) if parts else ""))

    def say(self, msg: str) -> None:
        with self.lock:
            self._clear()
            print(msg, file=self.stream, flush=True)

    def _clear(self):
        if self.tty and self.shown:
            self.stream.write("\r\033[K")
            self.shown = False

    def _loop(self):
        while not self.stop.wait(self.period):
            with self.lock:
                text = self.line()
                if self.tty:
                    width = shutil.get_terminal_size((120, 20)).columns - 1
                    self.stream.write("\r\033[K" + text[:width])
                    self.shown = True
                else:
                    self.stream.write(text + "\n")
                self.stream.flush()


def last_step(path: str) -> int | None:
    """The `step` of the last line of a metrics.jsonl (None when there is none yet); reads only its tail."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for ln in reversed(lines):
        try:
            return int(json.loads(ln)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None
