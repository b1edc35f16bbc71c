"""The code reward: run generated Python in a sandbox and score it against test cases. Never raises.

    from rewards.code_exec import run_function_tests, run_tests, ExecConfig
    run_function_tests("def add(a, b):\\n    return a + b", "add", [([1, 2], 3), ([2, 2], 5)])   # 0.5
    run_tests(code, ["assert add(1, 2) == 3", "assert add(0, 0) == 0"])                          # 1.0
    run_function_tests_detailed(...) / run_tests_detailed(...)   # ExecResult: per-case flags, errors, layers

Value-based scoring: the verdict never happens where the candidate's code runs. The sandboxed process only
loads the code, calls the function on each case's arguments and writes each return value as JSON to a pipe;
the expected values never enter it. This process decodes those values (plain JSON only: dicts, lists,
strings, numbers, booleans, null) and compares them here, with Python's == on the decoded values. An object
that is not JSON-representable (an "always equal" object, a generator, a set) fails its case; tuples arrive
as lists and dict keys as strings, so expected values are normalised the same way before comparing.

`run_tests(code, tests)` takes trusted test statements and turns each into such a case with `ast` here:
    assert f(<literals>) == <literal>      (also <literal> == f(...), and != )
    assert f(<literals>) is True / False / None
    assert f(<literals>)            assert not f(<literals>)
    assert math.isclose(f(<literals>), <literal>[, rel_tol=<literal>][, abs_tol=<literal>])
Arguments may be any Python literal (tuples, sets, bytes, negative numbers, keyword arguments). Any other
statement is refused: the whole call scores 0.0 with `error="unsupported test: ..."` and nothing runs.

How a run is contained (details and what each mode guarantees: docs/security.md). A trusted supervisor
process (rewards/_code_harness.py) makes private mount, network and pid namespaces (plus a user namespace
when not root), forks the runner, enforces the wall-clock limit and kills everything the run left behind;
it dies with this process. Before any candidate code the runner switches to a fresh unused uid (as root) or
drops every capability (user namespace), sets resource limits and no_new_privs, and installs Landlock
(writes only in its own temporary directory, reads only in system and Python directories, no TCP, no
signals out) and a seccomp filter (no sockets, ptrace, mounts, namespaces, io_uring; no fork / exec and no
signals to other processes unless allow_processes). These are kernel state: nothing the candidate does in
its own process can undo them. An audit hook gives early, readable refusals but is not relied on. The
environment is PATH, LANG, TMPDIR and HOME only. A layer that cannot be installed is reported in
ExecResult.sandbox and warned about once (SandboxWarning); refuse_weak=True refuses to run without
namespaces instead.
"""
from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import math
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
import warnings

__all__ = ["ExecConfig", "ExecResult", "wall_limit_s", "run_function_tests", "run_function_tests_detailed", "run_tests",
           "run_tests_detailed", "parse_test", "SandboxWarning"]

_HARNESS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_code_harness.py")
_UID_BASE = 1 << 28  # sandbox uids: far above any real account; one per run
_uid_counter = itertools.count()
_MAX_INT_DIGITS = 100_000  # longest integer accepted in a result (decimal digits)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecConfig:
    """Limits of one sandboxed run."""

    timeout_s: float = 10.0  # wall-clock limit of the whole run (start-up, loading and all cases)
    per_test_timeout_s: float = 2.0  # wall-clock limit for loading the code and for each call (SIGALRM)
    cpu_s: int = 10  # RLIMIT_CPU seconds
    memory_mb: int = 512  # RLIMIT_AS, megabytes of address space
    file_size_mb: int = 8  # RLIMIT_FSIZE, largest file the code may write
    disk_mb: int = 64  # all files together: the run is killed and scores 0 once its directory holds more
    max_procs: int = 16  # RLIMIT_NPROC (only meaningful with a private uid or user namespace)
    max_open_files: int = 64  # RLIMIT_NOFILE
    namespaces: bool = True  # private mount, network and pid namespaces (+ a user namespace when not root)
    drop_privileges: bool = True  # as root: run the code under a fresh unused uid/gid
    landlock: bool = True  # kernel file-system / TCP / signal confinement (Linux >= 5.13)
    seccomp: bool = True  # kernel system-call filter (x86_64): no sockets, ptrace, mounts; fork/exec per allow_processes
    refuse_weak: bool = False  # score 0.0 instead of running when namespaces cannot be made
    allow_processes: bool = False  # let the code fork / exec (still bounded by max_procs)
    audit_hook: bool = True  # in-process early refusals (a courtesy, not a guarantee: see docs/security.md)
    max_code_chars: int = 200_000  # longer code + case arguments give 0.0 without running
    max_output_chars: int = 1_000_000  # longest JSON text of one return value
    python: str | None = None  # interpreter for the sandbox; None = sys.executable

    def __post_init__(self):
        for name in ("timeout_s", "per_test_timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 3600:
                raise ValueError(f"ExecConfig.{name} must be a number of seconds in (0, 3600], got {v!r}")
        for name in ("cpu_s", "memory_mb", "file_size_mb", "disk_mb", "max_procs", "max_open_files", "max_code_chars",
                     "max_output_chars"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ExecConfig.{name} must be an int >= 1, got {v!r}")
        if self.memory_mb < 64:
            raise ValueError(f"ExecConfig.memory_mb must be >= 64 (the interpreter needs it), got {self.memory_mb}")
        for name in ("namespaces", "drop_privileges", "landlock", "seccomp", "refuse_weak", "allow_processes",
                     "audit_hook"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ExecConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.python is not None and not isinstance(self.python, str):
            raise ValueError(f"ExecConfig.python must be a path or None, got {self.python!r}")


GRACE_S = 3.0  # the supervisor's start-up and clean-up beyond ExecConfig.timeout_s

# CPython 3.11 can raise "SystemError: AST constructor recursion depth mismatch" when two threads build ASTs at once
# (the reward pool's and the tool's threads both parse here); one lock makes these parses one at a time.
_AST_LOCK = threading.Lock()


def _literal_eval(node_or_src):
    with _AST_LOCK:
        return ast.literal_eval(node_or_src)


def _ast_parse(src: str):
    with _AST_LOCK:
        return ast.parse(src)


def wall_limit_s(cfg: ExecConfig | None = None) -> float:
    """The longest one run_* call takes: timeout_s, the supervisor's grace, a second for this side's work. Whoever
    runs the sandbox under its own deadline (the reward pool) must allow at least this, or correct code that needs
    most of timeout_s scores 0 as a "timeout" and its run directory is left behind by the kill."""
    return (cfg or ExecConfig()).timeout_s + GRACE_S + 1.0


@dataclasses.dataclass
class ExecResult:
    """Outcome of one run: per-case pass flags and why anything went wrong."""

    passed: list[bool]
    fraction: float
    loaded: bool = False  # the solution itself ran without an exception
    timed_out: bool = False  # the whole run hit timeout_s
    error: str = ""  # sandbox, input or solution error kind ("" when none)
    seconds: float = 0.0
    stderr_tail: str = ""
    sandbox: dict = dataclasses.field(default_factory=dict)  # which layers were active
    case_errors: list[str] = dataclasses.field(default_factory=list)  # per case: "" or why it failed
    # per case: the decoded JSON return value, None when there was none (for callers that want the value itself,
    # e.g. rewards/python_tool.py; verdicts never use it)
    values: list = dataclasses.field(default_factory=list)


# ----------------------------------------------------------------------------------------------- cases
@dataclasses.dataclass(frozen=True)
class _Case:
    func: str
    args_src: str  # Python literal source of the positional arguments (a tuple)
    kwargs_src: str  # Python literal source of the keyword arguments (a dict)
    check: tuple  # ("eq", v) | ("ne", v) | ("is", True/False/None) | ("truthy",) | ("falsy",) | ("isclose", v, rel, abs)


class _Unsupported(ValueError):
    pass


def _canonical(value, depth=0):
    """An expected value as JSON would carry it back (tuples -> lists, non-str keys -> JSON key text)."""
    if depth > 200:
        raise _Unsupported("expected value nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, str):
                key = k
            elif k is None or isinstance(k, (bool, int, float)):
                key = json.dumps(k)  # how json.dumps writes a non-string key
            else:
                raise _Unsupported(f"dict key {type(k).__name__} cannot come back through JSON")
            out[key] = _canonical(v, depth + 1)
        return out
    raise _Unsupported(f"expected value of type {type(value).__name__} cannot come back through JSON")


def _literal_src(value, what: str) -> str:
    """Source text that ast.literal_eval turns back into `value` (checked), for sending arguments."""
    src = repr(value)
    try:
        ok = _literal_eval(src) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        ok = False
    if not ok:
        raise _Unsupported(f"{what} must be Python literals (no nan/inf, no objects), got {src[:80]}")
    return src


def _make_case(func, args, kwargs, check) -> _Case:
    if not isinstance(func, str) or not func.isidentifier():
        raise _Unsupported(f"function name must be an identifier, got {func!r}")
    return _Case(func, _literal_src(tuple(args), "arguments"), _literal_src(dict(kwargs), "keyword arguments"),
                 check)


def _call_of(node):
    """(name, args, kwargs) when `node` is name(<literals>, key=<literal>), else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    try:
        args = [_literal_eval(a) for a in node.args]
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                return None
            kwargs[kw.arg] = _literal_eval(kw.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return node.func.id, args, kwargs


def _literal(node):
    try:
        return True, _literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def parse_test(statement: str) -> _Case:
    """One trusted test statement -> a value case; raises ValueError for a form that is not supported."""
    try:
        tree = _ast_parse(statement)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise _Unsupported(f"does not parse ({type(e).__name__})") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise _Unsupported("not a single assert statement")
    test = tree.body[0].test
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        call, other = _call_of(left), right
        if call is None and isinstance(op, (ast.Eq, ast.NotEq)):
            call, other = _call_of(right), left
        ok, value = _literal(other)
        if call is not None and ok:
            if isinstance(op, (ast.Eq, ast.NotEq)):
                return _make_case(*call, ("eq" if isinstance(op, ast.Eq) else "ne", _canonical(value)))
            if isinstance(op, ast.Is) and (value is None or isinstance(value, bool)):
                return _make_case(*call, ("is", value))
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _call_of(test.operand):
        return _make_case(*_call_of(test.operand), ("falsy",))
    elif isinstance(test, ast.Call):
        f = test.func
        if (isinstance(f, ast.Attribute) and f.attr == "isclose" and isinstance(f.value, ast.Name)
                and f.value.id == "math" and len(test.args) == 2):
            call, (ok, value) = _call_of(test.args[0]), _literal(test.args[1])
            tol = {"rel_tol": 1e-9, "abs_tol": 0.0}
            for kw in test.keywords:
                good, v = _literal(kw.value)
                if kw.arg not in tol or not good or not isinstance(v, (int, float)) or isinstance(v, bool):
                    call = None
                    break
                tol[kw.arg] = float(v)
            if call is not None and ok and isinstance(value, (int, float)) and not isinstance(value, bool):
                return _make_case(*call, ("isclose", float(value), tol["rel_tol"], tol["abs_tol"]))
        elif _call_of(test):
            return _make_case(*_call_of(test), ("truthy",))
    raise _Unsupported("not one of: assert f(<literals>) == <literal> / != / is True|False|None, "
                       "assert [not] f(<literals>), assert math.isclose(f(<literals>), <number>, ...)")


def _check(check: tuple, got) -> bool:
    """The verdict for one decoded (plain JSON) return value. Runs on the trusted side only."""
    kind = check[0]
    try:
        if kind == "eq":
            return bool(got == check[1])
        if kind == "ne":
            return bool(got != check[1])
        if kind == "is":
            return got is check[1]
        if kind == "truthy":
            return bool(got)
        if kind == "falsy":
            return not got
        if kind == "isclose":
            return (isinstance(got, (int, float)) and not isinstance(got, bool)
                    and math.isclose(float(got), check[1], rel_tol=check[2], abs_tol=check[3]))
    except (RecursionError, OverflowError, MemoryError):
        return False
    return False


def _parse_int(text: str) -> int:
    """json's parse_int without the 4,300-digit limit (results may be long integers), up to _MAX_INT_DIGITS."""
    digits = len(text.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        raise ValueError("integer too long")
    if digits <= 4000:
        return int(text)
    neg, body = text.startswith("-"), text.lstrip("-")

    def conv(s):
        if len(s) <= 4000:
            return int(s)
        half = len(s) // 2
        return conv(s[:-half]) * 10 ** half + conv(s[-half:])

    value = conv(body)
    return -value if neg else value


def _decode(text: str):
    """(ok, value) for one result line's JSON text; anything malformed is not a value."""
    try:
        return True, json.loads(text, parse_int=_parse_int)
    except (ValueError, RecursionError, MemoryError):
        return False, None


# ----------------------------------------------------------------------------------------------- API
def run_function_tests_detailed(code, func_name, cases, cfg: ExecConfig | None = None) -> ExecResult:
    """Call `func_name` from `code` on each case's arguments in the sandbox; compare here. Never raises.

    cases: iterable of (args, expected) with args a list of JSON values (Python literals in general) and
    expected a JSON value."""
    t0 = time.monotonic()
    try:
        cases = list(cases)
        built = []
        for item in cases:
            args, expected = item
            if not isinstance(args, (list, tuple)):
                raise _Unsupported(f"case arguments must be a list, got {type(args).__name__}")
            built.append(_make_case(func_name, args, {}, ("eq", _canonical(expected))))
    except (_Unsupported, TypeError, ValueError) as e:
        return ExecResult([], 0.0, error=f"bad cases: {e}"[:300])
    return _score(code, built, cfg, t0)


def run_function_tests(code, func_name, cases, cfg: ExecConfig | None = None) -> float:
    """Share of (args, expected) cases where code's `func_name(*args)` returns `expected`, in [0, 1]."""
    return run_function_tests_detailed(code, func_name, cases, cfg).fraction


def run_tests_detailed(code, tests, cfg: ExecConfig | None = None) -> ExecResult:
    """Run assert-style test statements as value cases (see the module docstring). Never raises."""
    t0 = time.monotonic()
    if isinstance(tests, str):
        tests = [tests]
    if not isinstance(tests, (list, tuple)) or not all(isinstance(t, str) for t in tests):
        return ExecResult([], 0.0, error="bad input")
    built = []
    for i, t in enumerate(tests):
        try:
            built.append(parse_test(t))
        except _Unsupported as e:
            return ExecResult([False] * len(tests), 0.0, error=f"unsupported test: test {i}: {e}"[:300])
    return _score(code, built, cfg, t0)


def run_tests(code, tests, cfg: ExecConfig | None = None) -> float:
    """Share of `tests` the generated `code` passes, in [0, 1]. Never raises."""
    return run_tests_detailed(code, tests, cfg).fraction


def _score(code, cases: list[_Case], cfg: ExecConfig | None, t0: float) -> ExecResult:
    cfg = cfg or ExecConfig()
    if not isinstance(code, str):
        return ExecResult([False] * len(cases), 0.0, error="bad input")
    if not cases:
        return ExecResult([], 0.0, error="no tests")
    size = len(code) + sum(len(c.args_src) + len(c.kwargs_src) + len(c.func) for c in cases)
    if size > cfg.max_code_chars:
        return ExecResult([False] * len(cases), 0.0, error="too long")
    try:
        return _run(code, cases, cfg, t0)
    except Exception as e:  # noqa: BLE001 - a reward never raises
        return ExecResult([False] * len(cases), 0.0, error=f"sandbox: {type(e).__name__}: {e}"[:300],
                          seconds=time.monotonic() - t0, case_errors=["sandbox"] * len(cases))


# ----------------------------------------------------------------------------------------------- sandbox
class SandboxWarning(RuntimeWarning):
    """The code sandbox runs with fewer layers than it would as root on a recent Linux kernel."""


_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(message: str) -> None:
    with _warn_lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, SandboxWarning, stacklevel=4)


def _next_uid() -> int:
    # Unique per (process, run): pid in the high bits, a counter in the low bits.
    return _UID_BASE + ((os.getpid() & 0x3FFFFF) << 6) + (next(_uid_counter) & 0x3F)


def _run(code: str, cases: list[_Case], cfg: ExecConfig, t0: float) -> ExecResult:
    is_root = os.geteuid() == 0
    uid = _next_uid() if (cfg.drop_privileges and is_root) else None
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="codeexec-"))
    fds: list[int] = []
    proc = None
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        res_r, res_w = os.pipe()
        st_r, st_w = os.pipe()
        fds += [res_r, res_w, st_r, st_w]
        nonce = secrets.token_hex(16)
        payload = json.dumps({
            "result_fd": res_w, "status_fd": st_w, "parent_pid": os.getpid(), "nonce": nonce, "uid": uid,
            "workdir": workdir, "code": code, "calls": [[c.func, c.args_src, c.kwargs_src] for c in cases],
            "deadline_s": max(0.1, cfg.timeout_s - (time.monotonic() - t0)), "cpu_s": cfg.cpu_s,
            "memory_mb": cfg.memory_mb, "file_size_mb": cfg.file_size_mb, "disk_mb": cfg.disk_mb,
            "max_open_files": cfg.max_open_files,
            "max_procs": cfg.max_procs, "per_call_timeout_s": cfg.per_test_timeout_s,
            "max_output_chars": cfg.max_output_chars, "allow_processes": cfg.allow_processes,
            "audit_hook": cfg.audit_hook, "namespaces": cfg.namespaces, "landlock": cfg.landlock,
            "seccomp": cfg.seccomp, "refuse_weak": cfg.refuse_weak,
        }).encode("utf-8")
        cmd = [cfg.python or sys.executable, "-I", "-S", _HARNESS_PATH]
        # A clean environment: nothing of this process's (secrets, paths) reaches the run.
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": workdir, "HOME": workdir}
        err_path = os.path.join(workdir, ".stderr")
        with open(err_path, "wb") as err_file:
            if uid is not None:
                os.chown(err_path, uid, uid)
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=err_file, pass_fds=(res_w, st_w), close_fds=True, start_new_session=True)
        for fd in (res_w, st_w):
            os.close(fd)
            fds.remove(fd)
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        # The supervisor enforces timeout_s itself; the grace covers its start-up and clean-up.
        lines, status, timed_out = _read(res_r, st_r, t0 + cfg.timeout_s + GRACE_S, _out_cap(cfg, len(cases)))
        layers = _layers(status, cfg, uid)
        _warn_if_weak(layers, cfg, is_root)
        if layers.get("refused"):
            return ExecResult([False] * len(cases), 0.0, error="sandbox: refused (no namespaces, refuse_weak=True)",
                              seconds=time.monotonic() - t0, sandbox=layers, case_errors=["refused"] * len(cases))
        if layers.get("disk"):  # wrote past the total cap: killed, and nothing it computed counts
            return ExecResult([False] * len(cases), 0.0, error=f"disk: the run wrote over {cfg.disk_mb} MB or "
                              "too many files", seconds=time.monotonic() - t0, sandbox=layers,
                              case_errors=["disk"] * len(cases))
        return _result(lines, nonce, cases, timed_out or layers.get("timeout", False), workdir, t0, layers)
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # normally gone already
            except (ProcessLookupError, PermissionError, OSError):
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(workdir, ignore_errors=True)


def _out_cap(cfg: ExecConfig, n_cases: int) -> int:
    """Most bytes read from the result pipe: every case at its largest, plus the framing."""
    return n_cases * (cfg.max_output_chars + 128) + 4096


def _read(res_r: int, st_r: int, deadline: float, cap: int) -> tuple[list[str], list[str], bool]:
    """Read the result pipe (the candidate's process) and the status pipe (the trusted supervisor) until both
    close (the supervisor exits only after every process of the run is gone) or the deadline passes. No line
    on either pipe ends the reading early, so a forged "done" cannot cut the results short."""
    bufs = {res_r: bytearray(), st_r: bytearray()}
    caps = {res_r: cap, st_r: 1 << 16}
    open_fds = {res_r, st_r}
    timed_out = False
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        ready, _, _ = select.select(list(open_fds), [], [], min(remaining, 0.5))
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                bufs[fd] += chunk
            if not chunk or len(bufs[fd]) > caps[fd]:
                open_fds.discard(fd)
    return (bufs[res_r].decode("utf-8", "replace").split("\n"), bufs[st_r].decode("utf-8", "replace").split("\n"),
            timed_out)


def _layers(status_lines: list[str], cfg: ExecConfig, uid) -> dict:
    """What the supervisor (P) and the runner (C, before any candidate code) report about the layers."""
    out = {"audit_hook": cfg.audit_hook}
    for line in status_lines:
        who, _, text = line.partition(" ")
        if who not in ("P", "C"):
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.update(obj)
    out["dropped_uid"] = uid is not None and out.get("uid") == uid
    out.pop("end", None)
    return out


def _warn_if_weak(layers: dict, cfg: ExecConfig, is_root: bool) -> None:
    """Say once, loudly, when a layer that was asked for could not be installed."""
    if "uid" not in layers:
        return  # the runner did not start; the result carries the error
    missing = []
    if cfg.namespaces and not layers.get("ns"):
        missing.append("namespaces (" + layers.get("ns_error", "unavailable") + "): the parent's environment and "
                       "network are hidden only by Landlock / seccomp, and only processes re-parented to the "
                       "supervisor are killed")
    if cfg.landlock and not layers.get("landlock"):
        missing.append("Landlock (kernel >= 5.13): no file-system confinement beyond the audit hook")
    elif cfg.landlock and layers.get("landlock", 0) < 6:
        missing.append(f"Landlock ABI 6 (have {layers.get('landlock')}): signals outside the run are not scoped")
    if cfg.seccomp and not layers.get("seccomp"):
        missing.append("seccomp (x86_64 only): sockets and process creation are refused by the audit hook alone")
    if cfg.drop_privileges and not is_root:
        missing.insert(0, "a private uid (not root): the code runs as this user inside a user namespace")
    if missing:
        _warn_once("rewards.code_exec: the code sandbox runs without " + "; ".join(missing)
                   + ". See docs/security.md for what this mode still guarantees.")
def _result(lines, nonce, cases, timed_out, workdir, t0, sandbox) -> ExecResult:
    n = len(cases)
    passed, errors, values = [False] * n, ["no result"] * n, [None] * n
    seen = set()
    loaded, error, started = False, "", False
    for line in lines:
        parts = line.split(" ", 3)
        if len(parts) < 2 or parts[0] != nonce:
            continue  # not from the harness
        kind = parts[1]
        if kind == "L":
            started = True
        elif kind == "S" and len(parts) == 3:
            loaded = parts[2] == "1"
        elif kind == "E" and len(parts) == 3:
            error = error or parts[2][:64]
        elif kind in ("R", "X") and len(parts) == 4 and parts[2].isdigit():
            i = int(parts[2])
            if not 0 <= i < n or i in seen:
                continue  # the first word on a case counts
            seen.add(i)
            if kind == "X":
                errors[i] = parts[3][:64]
                continue
            ok, value = _decode(parts[3])
            if not ok:
                errors[i] = "not JSON"
            else:
                passed[i] = _check(cases[i].check, value)
                values[i] = value
                errors[i] = "" if passed[i] else "wrong value"
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
    return ExecResult(passed, sum(passed) / n, loaded=loaded, timed_out=timed_out, error=error,
                      seconds=time.monotonic() - t0, stderr_tail=stderr_tail, sandbox=sandbox, case_errors=errors,
                      values=values)
