"""Tie a helper process's life to its parent's, so nothing outlives a SIGKILLed trainer.

Used by the reward pool's workers (rewards/pool.py) and the sympy worker (rewards/_verify_worker.py):

    from rewards._lifeline import die_with_parent, release_forkserver_lifeline
    die_with_parent()               # first thing in the child: the kernel SIGKILLs it when its parent exits
    release_forkserver_lifeline()   # in a process started by multiprocessing's forkserver (see below)

die_with_parent uses PR_SET_PDEATHSIG, so it holds even while the child is stuck in C code holding the GIL.
Caveat (Linux semantics): the "parent" is the thread that created the child; if that thread exits first, the
child is killed too. The pool starts workers from its manager thread, which lives as long as the pool.

The forkserver chain: a pool worker's parent is the forkserver, not the trainer. The forkserver exits when the
write end of its "alive" pipe is closed everywhere, but every process it forks inherits a copy, so a hung
worker kept it (and itself) alive forever. release_forkserver_lifeline closes the worker's copy; then the
trainer's death ends the forkserver, whose death SIGKILLs the workers, whose deaths SIGKILL their sympy
children, and the resource tracker follows when its last client is gone.
"""
from __future__ import annotations

import ctypes
import os
import signal
import stat
from multiprocessing import forkserver

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent exits; exit now if the parent is already gone.
    Returns whether the request is in place (False off Linux)."""
    ppid = os.getppid()
    armed = False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                           ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):
        armed = False
    if os.getppid() != ppid:  # the parent died before the request was in place
        os._exit(0)
    return armed


def release_forkserver_lifeline() -> bool:
    """Close this process's copy of the forkserver's "alive" pipe (inherited from the server; see the module
    docstring). Returns whether a copy was closed."""
    try:
        server = forkserver._forkserver
        fd = server._forkserver_alive_fd
    except AttributeError:
        return False
    if fd is None or getattr(server, "_forkserver_pid", None) is not None:
        return False  # not a forkserver child (the client itself holds the pipe legitimately)
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.close(fd)
    except OSError:
        return False
    server._forkserver_alive_fd = None
    return True
