"""Sandboxed execution of generated Python against tests: the code reward.

    from rewards.code_exec import run_tests, run_tests_detailed, ExecConfig
    run_tests("def add(a, b):\\n    return a + b", ["assert add(1, 2) == 3", "assert add(0, 0) == 1"])  # 0.5
    run_tests_detailed(code, tests, ExecConfig(timeout_s=5)).passed   # per-test booleans, timing, flags

reward = share of tests passed (0.0 when the code does not even load). Never raises: every failure of the
sandbox machinery gives 0.0 with `error` set in the detailed result.

How one run is contained (layers, so that one bypass is not enough):
  process    a fresh `python -I -S` (isolated: no site, no user paths, PYTHON* ignored) in its own session /
             process group, cwd = a new private temporary directory, environment = PATH and LANG only.
  limits     set by the trusted harness before any generated code runs: RLIMIT_CPU (cpu_s), RLIMIT_AS
             (memory_mb), RLIMIT_FSIZE (file_size_mb), RLIMIT_NPROC (max_procs), RLIMIT_NOFILE, no core files;
             plus a wall-clock limit for the whole run (timeout_s) and one per test (per_test_timeout_s, SIGALRM).
  identity   when run as root (drop_privileges), the harness switches to a fresh unused uid/gid (one per run),
             so the code cannot write anywhere outside its directory (which it owns), RLIMIT_NPROC applies
             (root ignores it), and every process the run created can be killed as a set: the harness ends
             with kill(-1) under that uid and the parent does the same (via setpriv) after a timeout.
             Standard-library modules that solutions commonly use are imported before the switch, because
             the interpreter's files may not be readable by another uid.
  network    a new empty network namespace (`unshare -n`) when available (root, util-linux), and always an
             audit hook that refuses socket creation.
  audit hook refuses: opening files for writing / creating, removing, renaming, linking, chmod/chown outside
             the run's directory, changing directory out of it, opening directories outside it (a directory
             descriptor would allow os.open(name, dir_fd=...)); socket creation; process creation (fork, exec, spawn, system, Popen) unless
             allow_processes; signals to other processes; ctypes / cffi (which would bypass the hook).
  reporting  the harness writes "<nonce> <test index> <0|1>" lines to a private pipe; exit codes are never
             trusted (sys.exit(0) or os._exit(0) in generated code pass nothing), forked children never
             report, and lines without the run's random nonce are ignored. Generated code runs in the same
             interpreter as the harness, so a determined program could read the nonce from memory; the
             layers above still contain it, but do not treat this reward as proof against adversarial code.

Tests are Python statements (typically `assert f(x) == y`), each run after the solution in the solution's
namespace; a test passes when it finishes without an exception within per_test_timeout_s.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["ExecConfig", "ExecResult", "run_tests", "run_tests_detailed", "netns_available"]

_UID_BASE = 1 << 28  # sandbox uids: far above any real account; one per run
_uid_counter = itertools.count()
_netns_cache: dict[str, bool] = {}
_netns_lock = threading.Lock()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecConfig:
    """Limits of one sandboxed run."""

    timeout_s: float = 10.0  # wall-clock limit of the whole run (start-up, solution and all tests)
    per_test_timeout_s: float = 2.0  # wall-clock limit per test (SIGALRM inside the sandbox)
    cpu_s: int = 10  # RLIMIT_CPU seconds
    memory_mb: int = 512  # RLIMIT_AS, megabytes of address space
    file_size_mb: int = 8  # RLIMIT_FSIZE, largest file the code may write
    max_procs: int = 16  # RLIMIT_NPROC for the sandbox uid (only enforced with drop_privileges as root)
    max_open_files: int = 64  # RLIMIT_NOFILE
    network_namespace: bool = True  # use `unshare -n` when available (the socket audit hook is always on)
    drop_privileges: bool = True  # as root: run the code under a fresh unused uid/gid
    allow_processes: bool = False  # let the code fork / exec (still bounded by max_procs)
    audit_hook: bool = True  # the in-process guard; switch off only to test the other layers
    max_code_chars: int = 200_000  # longer code or tests give 0.0 without running
    python: str | None = None  # interpreter for the sandbox; None = sys.executable

    def __post_init__(self):
        for name in ("timeout_s", "per_test_timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 3600:
                raise ValueError(f"ExecConfig.{name} must be a number of seconds in (0, 3600], got {v!r}")
        for name in ("cpu_s", "memory_mb", "file_size_mb", "max_procs", "max_open_files", "max_code_chars"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ExecConfig.{name} must be an int >= 1, got {v!r}")
        if self.memory_mb < 64:
            raise ValueError(f"ExecConfig.memory_mb must be >= 64 (the interpreter needs it), got {self.memory_mb}")
        for name in ("network_namespace", "drop_privileges", "allow_processes", "audit_hook"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ExecConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.python is not None and not isinstance(self.python, str):
            raise ValueError(f"ExecConfig.python must be a path or None, got {self.python!r}")


@dataclasses.dataclass
class ExecResult:
    """Outcome of one run: per-test pass flags and why anything went wrong."""

    passed: list[bool]
    fraction: float
    loaded: bool = False  # the solution itself ran without an exception
    timed_out: bool = False  # the whole run hit timeout_s
    error: str = ""  # sandbox or solution error kind ("" when none)
    seconds: float = 0.0
    stderr_tail: str = ""
    sandbox: dict = dataclasses.field(default_factory=dict)  # which layers were active


# The trusted harness. It runs as `python -I -S -c HARNESS` with the payload (JSON) on stdin.
_HARNESS = r'''
import os, sys, json, signal, resource, builtins
_PRELOAD = ("math", "cmath", "collections", "collections.abc", "itertools", "functools", "heapq", "bisect",
            "re", "string", "fractions", "decimal", "random", "statistics", "operator", "copy", "typing",
            "dataclasses", "enum", "array", "struct", "datetime", "time", "textwrap", "unicodedata",
            "numbers", "io", "json", "hashlib", "base64", "queue", "contextlib", "abc", "types", "traceback",
            "warnings", "weakref", "keyword", "sys", "_strptime", "calendar", "pprint", "difflib", "pathlib",
            "shutil", "glob", "fnmatch", "csv", "tempfile", "locale", "codecs", "errno", "stat")
def _harness():
    cfg = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdin.close()
    out_fd, nonce, my_pid = cfg["fd"], cfg["nonce"], os.getpid()
    def report(line):
        if os.getpid() != my_pid:
            os._exit(0)  # a forked child never reports
        try:
            os.write(out_fd, (nonce + " " + line + "\n").encode())
        except OSError:
            pass
    for name in _PRELOAD:
        try:
            __import__(name)
        except Exception:
            pass
    MB = 1 << 20
    limits = [(resource.RLIMIT_CPU, cfg["cpu_s"]), (resource.RLIMIT_AS, cfg["memory_mb"] * MB),
              (resource.RLIMIT_FSIZE, cfg["file_size_mb"] * MB), (resource.RLIMIT_NOFILE, cfg["max_open_files"]),
              (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, cfg["max_procs"])]
    for which, value in limits:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing
    uid = cfg["uid"]
    dropped = False
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        dropped = os.getuid() == uid and uid >= (1 << 28)
    report("L dropped=%d" % dropped)
    root = os.path.realpath(os.getcwd())
    allow_procs = cfg["allow_processes"]
    state = {"in_hook": False, "harness_kill": False}
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    PROC_EVENTS = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
                   "subprocess.Popen", "pty.spawn", "os.startfile"}
    PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                   "os.symlink", "os.truncate", "os.utime", "shutil.copyfile", "shutil.copymode",
                   "shutil.copystat", "shutil.copytree", "shutil.rmtree", "shutil.move", "shutil.chown",
                   "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod"}
    BLOCKED_MODULES = ("ctypes", "_ctypes", "cffi", "_cffi_backend")
    def inside(path, fd_ok=True):
        if isinstance(path, int):
            if fd_ok:
                return True  # an already-open descriptor
            try:
                path = os.readlink("/proc/self/fd/%d" % path)
            except OSError:
                return False
        try:
            p = os.fsdecode(path)
        except Exception:
            return False
        full = os.path.realpath(p)  # relative paths resolve against the current directory, as open() does
        return full == root or full.startswith(root + os.sep)
    def hook(event, args):
        if state["in_hook"]:
            return
        state["in_hook"] = True
        try:
            if event == "open":
                path, mode, flags = (tuple(args) + (None, None, None))[:3]
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags >= 0 and flags & WRITE_FLAGS)
                if writing and not inside(path):
                    raise PermissionError("sandbox: writing outside the run directory is not allowed")
                if not isinstance(path, int) and not inside(path) and os.path.isdir(path):
                    # A directory descriptor from outside would let os.open(name, dir_fd=...) write there.
                    raise PermissionError("sandbox: opening directories outside the run directory is not allowed")
            elif event == "os.chdir":
                if args and not inside(args[0], fd_ok=False):
                    raise PermissionError("sandbox: leaving the run directory is not allowed")
            elif event in PATH_EVENTS:
                for a in args:
                    if isinstance(a, (str, bytes, os.PathLike)) and not inside(a):
                        raise PermissionError("sandbox: %s outside the run directory" % event)
            elif event.startswith("socket."):
                raise PermissionError("sandbox: network access is not allowed")
            elif event in PROC_EVENTS and not allow_procs:
                raise PermissionError("sandbox: creating processes is not allowed")
            elif event in ("os.kill", "os.killpg") and not state["harness_kill"]:
                if not (event == "os.kill" and args and args[0] == os.getpid()):
                    raise PermissionError("sandbox: signalling other processes is not allowed")
            elif event == "import" and args and str(args[0]).split(".")[0] in BLOCKED_MODULES:
                raise ImportError("sandbox: %s is not available" % args[0])
            elif event.startswith("ctypes.") or event == "sys.addaudithook":
                raise PermissionError("sandbox: %s is not allowed" % event)
        finally:
            state["in_hook"] = False
    if cfg["audit_hook"]:
        sys.addaudithook(hook)
    class SandboxTimeout(BaseException):
        pass
    def on_alarm(signum, frame):
        raise SandboxTimeout()
    signal.signal(signal.SIGALRM, on_alarm)
    ns = {"__name__": "__main__", "__builtins__": builtins}
    per_test = cfg["per_test_timeout_s"]
    loaded = False
    try:
        code = compile(cfg["code"], "<solution>", "exec")
        signal.setitimer(signal.ITIMER_REAL, per_test)
        exec(code, ns)
        signal.setitimer(signal.ITIMER_REAL, 0)
        loaded = True
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        report("E " + type(e).__name__)
    if os.getpid() != my_pid:
        os._exit(0)
    report("S %d" % loaded)
    for i, test in enumerate(cfg["tests"]):
        ok = False
        if loaded:
            try:
                t = compile(test, "<test %d>" % i, "exec")
                signal.setitimer(signal.ITIMER_REAL, per_test)
                exec(t, ns)
                signal.setitimer(signal.ITIMER_REAL, 0)
                ok = True
            except BaseException:
                signal.setitimer(signal.ITIMER_REAL, 0)
                ok = False
        report("T %d %d" % (i, ok))
    report("D")
    try:
        os.close(out_fd)
    except OSError:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if dropped:
        state["harness_kill"] = True
        os.kill(-1, signal.SIGKILL)  # every other process of this run's private uid
    os._exit(0)
try:
    _harness()
except BaseException:
    os._exit(1)
'''


def netns_available() -> bool:
    """Whether `unshare -n` works here (root with CAP_SYS_ADMIN and util-linux); checked once."""
    with _netns_lock:
        if "ok" not in _netns_cache:
            ok = False
            exe = shutil.which("unshare")
            if exe and os.geteuid() == 0:
                try:
                    ok = subprocess.run([exe, "-n", "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, timeout=10).returncode == 0
                except (OSError, subprocess.SubprocessError):
                    ok = False
            _netns_cache["ok"] = ok
        return _netns_cache["ok"]


def _next_uid() -> int:
    # Unique per (process, run): pid in the high bits, a counter in the low bits.
    return _UID_BASE + ((os.getpid() & 0x3FFFFF) << 6) + (next(_uid_counter) & 0x3F)


def _kill_uid(uid: int, rounds: int = 3) -> None:
    """SIGKILL every process of a sandbox uid (kill(-1) run as that uid, through setpriv)."""
    if uid < _UID_BASE:
        return  # never for a real account
    exe = shutil.which("setpriv")
    if not exe:
        return
    for _ in range(rounds):  # a fork bomb may still be forking while we kill: repeat
        try:
            subprocess.run([exe, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "kill", "-9", "-1"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=5)
        except (OSError, subprocess.SubprocessError):
            return


def _normalise_tests(tests) -> list[str] | None:
    if isinstance(tests, str):
        return [tests]
    if isinstance(tests, (list, tuple)) and all(isinstance(t, str) for t in tests):
        return list(tests)
    return None


def run_tests_detailed(code, tests, cfg: ExecConfig | None = None) -> ExecResult:
    """Run `code` then each test in the sandbox; see the module docstring. Never raises."""
    t0 = time.monotonic()
    cfg = cfg or ExecConfig()
    tests_list = _normalise_tests(tests)
    if not isinstance(code, str) or tests_list is None:
        return ExecResult([], 0.0, error="bad input")
    if not tests_list:
        return ExecResult([], 0.0, error="no tests")
    if len(code) + sum(len(t) for t in tests_list) > cfg.max_code_chars:
        return ExecResult([False] * len(tests_list), 0.0, error="too long")
    try:
        return _run(code, tests_list, cfg, t0)
    except Exception as e:  # noqa: BLE001 - a reward never raises
        return ExecResult([False] * len(tests_list), 0.0, error=f"sandbox: {type(e).__name__}: {e}"[:300],
                          seconds=time.monotonic() - t0)


def run_tests(code, tests, cfg: ExecConfig | None = None) -> float:
    """Share of `tests` the generated `code` passes, in [0, 1]. Never raises."""
    return run_tests_detailed(code, tests, cfg).fraction


def _run(code: str, tests: list[str], cfg: ExecConfig, t0: float) -> ExecResult:
    is_root = os.geteuid() == 0
    drop = cfg.drop_privileges and is_root
    uid = _next_uid() if drop else None
    use_netns = cfg.network_namespace and netns_available()
    workdir = tempfile.mkdtemp(prefix="codeexec-")
    r_fd = w_fd = -1
    proc = None
    try:
        if drop:
            os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        r_fd, w_fd = os.pipe()
        nonce = secrets.token_hex(16)
        payload = json.dumps({
            "fd": w_fd, "nonce": nonce, "uid": uid, "code": code, "tests": tests, "cpu_s": cfg.cpu_s,
            "memory_mb": cfg.memory_mb, "file_size_mb": cfg.file_size_mb, "max_open_files": cfg.max_open_files,
            "max_procs": cfg.max_procs, "per_test_timeout_s": cfg.per_test_timeout_s,
            "allow_processes": cfg.allow_processes, "audit_hook": cfg.audit_hook,
        }).encode("utf-8")
        cmd = [cfg.python or sys.executable, "-I", "-S", "-c", _HARNESS]
        if use_netns:
            cmd = [shutil.which("unshare"), "-n", "--"] + cmd
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        err_path = os.path.join(workdir, ".stderr")
        with open(err_path, "wb") as err_file:
            if drop:
                os.chown(err_path, uid, uid)
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=err_file, pass_fds=(w_fd,), close_fds=True, start_new_session=True)
        os.close(w_fd)
        w_fd = -1
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        lines, timed_out = _read_reports(r_fd, proc, t0 + cfg.timeout_s)
        return _result(lines, nonce, tests, timed_out, workdir, t0,
                       {"netns": use_netns, "dropped_uid": drop, "audit_hook": cfg.audit_hook})
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if uid is not None:
                # A clean finish (exit 0) means the harness already ran kill(-1) under its uid; anything else
                # (timeout, crash, CPU limit) may have left processes of that uid behind.
                _kill_uid(uid, rounds=1 if proc.returncode == 0 else 3)
        for fd in (r_fd, w_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        shutil.rmtree(workdir, ignore_errors=True)


def _read_reports(r_fd: int, proc, deadline: float) -> tuple[list[str], bool]:
    """Read report lines until the harness says done, the pipe closes, or the deadline passes."""
    buf = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return buf.decode("utf-8", "replace").splitlines(), True
        ready, _, _ = select.select([r_fd], [], [], min(remaining, 0.5))
        if ready:
            chunk = os.read(r_fd, 65536)
            if not chunk:
                return buf.decode("utf-8", "replace").splitlines(), False
            buf += chunk
            if len(buf) > (1 << 20):
                return buf[: 1 << 20].decode("utf-8", "replace").splitlines(), False
            if b" D\n" in buf:
                return buf.decode("utf-8", "replace").splitlines(), False
        elif proc.poll() is not None and not ready:
            # The harness is gone; a forked child may still hold the pipe open. Take what is there.
            ready, _, _ = select.select([r_fd], [], [], 0)
            if not ready:
                return buf.decode("utf-8", "replace").splitlines(), False


def _result(lines, nonce, tests, timed_out, workdir, t0, sandbox) -> ExecResult:
    passed = [False] * len(tests)
    seen = set()
    loaded, error = False, ""
    for line in lines:
        parts = line.split(" ")
        if len(parts) < 2 or parts[0] != nonce:
            continue  # not from the harness
        kind = parts[1]
        if kind == "S" and len(parts) == 3:
            loaded = parts[2] == "1"
        elif kind == "E" and len(parts) == 3:
            error = error or parts[2][:64]
        elif kind == "L" and len(parts) == 3:
            sandbox["dropped_uid"] = parts[2] == "dropped=1"
        elif kind == "T" and len(parts) == 4 and parts[2].isdigit():
            i = int(parts[2])
            if 0 <= i < len(tests) and i not in seen:  # first report wins
                seen.add(i)
                passed[i] = parts[3] == "1"
    started = any(line.startswith(nonce + " L ") for line in lines)
    if timed_out and not error:
        error = "timeout"
    elif not started:
        error = error or "sandbox did not start"  # e.g. the interpreter or unshare failed: see stderr_tail
    stderr_tail = ""
    try:
        with open(os.path.join(workdir, ".stderr"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 2000))
            stderr_tail = f.read().decode("utf-8", "replace")
    except OSError:
        pass
    return ExecResult(passed, sum(passed) / len(tests), loaded=loaded, timed_out=timed_out, error=error,
                      seconds=time.monotonic() - t0, stderr_tail=stderr_tail, sandbox=sandbox)
