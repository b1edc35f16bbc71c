"""One process per workdir: an exclusive lock on the run directory, released by the OS when the process dies.

    from rl.workdir_lock import WorkdirError, lock_workdir, holder
    lock = lock_workdir("runs/quickstart", "launch")   # creates the directory; WorkdirError if another process has it
                                                        # (or the directory cannot be made: under a file, in /proc)
    ...                                                 # the run; the lock is held as long as this process lives
    lock.release()                                      # optional: exit releases it too, whatever the exit
    holder("runs/quickstart")                           # "pid 1234 (launch, since ...)" while held, else None

The lock is flock(2) on `<workdir>/.lock` (opened close-on-exec, so no launched program inherits it), taken without
waiting: a second launch into a workdir whose run is still going (or whose launcher outlived a killed sweep) is
refused with a message naming the holder, instead of both writing metrics, samples and checkpoints into the same
files. A crash, SIGKILL or power loss cannot leave a stale lock: the kernel drops it with the process. The file keeps
the last holder's pid and command only for the message; its presence means nothing.

experiments/launch.py takes it for the whole run; experiments/sweep.py takes it on its own workdir and checks every
point's workdir before running anything (a launcher still running there from an earlier sweep refuses the sweep).
"""
from __future__ import annotations

import fcntl
import os
import sys
import time

__all__ = ["LOCK_NAME", "WorkdirError", "WorkdirLock", "lock_workdir", "holder"]

LOCK_NAME = ".lock"


class WorkdirError(RuntimeError):
    """The workdir cannot be used: another live process holds it, or it cannot be created or locked. The message
    names the directory, the holder or the OS error, and what to do."""


class WorkdirLock:
    """A held lock (see lock_workdir); release() or process exit frees it."""

    def __init__(self, path: str, fd: int):
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor of the open file drops the flock
            self._fd = None

    def __enter__(self) -> "WorkdirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(500).strip()
    except OSError:
        return ""


def lock_workdir(workdir: str, purpose: str) -> WorkdirLock:
    """Create `workdir` if needed and hold its lock; WorkdirError naming the holder when a live process holds it,
    or naming the OS error when the directory cannot be made or locked (under a file, in /proc, read-only)."""
    path = os.path.join(workdir, LOCK_NAME)
    if os.path.lexists(workdir) and not os.path.isdir(workdir):
        raise WorkdirError(f"--workdir {workdir!r} exists and is not a directory")
    try:
        os.makedirs(workdir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise WorkdirError(f"--workdir {workdir}: cannot create or lock it ({e.strerror or type(e).__name__}"
                           f"{': ' + e.filename if e.filename else ''}); choose a writable directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        who = _read_holder(path) or "another process"
        raise WorkdirError(f"{workdir} is in use by {who}: one run per workdir. Wait for it to finish (or stop it), "
                          "or use another --workdir") from None
    except OSError as e:  # a file system without flock
        os.close(fd)
        raise WorkdirError(f"--workdir {workdir}: cannot lock {path} ({e.strerror}); use a local directory") from None
    info = (f"pid {os.getpid()} ({purpose}, since {time.strftime('%Y-%m-%d %H:%M:%S')}: "
            f"{' '.join(sys.argv)[:300]})")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode("utf-8", "replace"), 0)
    except OSError:
        pass  # the lock holds without the note
    return WorkdirLock(path, fd)


def holder(workdir: str) -> str | None:
    """Who holds the lock of `workdir` right now ("pid N (launch, since ...)"), or None when nobody does (also when
    the directory or lock file does not exist). Takes and drops the lock to find out, so it never blocks."""
    path = os.path.join(workdir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(path) or "another process"
    except OSError:
        return None
    finally:
        os.close(fd)
    return None
