"""The program that runs inside the code sandbox (rewards/code_exec.py starts it; never import it).

It runs as `python -I -S rewards/_code_harness.py` with a JSON payload on stdin, and uses only the standard
library. It only COMPUTES: it loads the candidate's code, calls the named functions on the given arguments and
writes each return value, serialised as JSON, to the result pipe. It never sees an expected value and never
decides whether a test passed; rewards/code_exec.py does that on the trusted side.
"""
import ast
import builtins
import json
import os
import resource
import signal
import sys

_PRELOAD = ("math", "cmath", "collections", "collections.abc", "itertools", "functools", "heapq", "bisect",
            "re", "string", "fractions", "decimal", "random", "statistics", "operator", "copy", "typing",
            "dataclasses", "enum", "array", "struct", "datetime", "time", "textwrap", "unicodedata",
            "numbers", "io", "hashlib", "base64", "queue", "contextlib", "abc", "types", "traceback",
            "warnings", "weakref", "keyword", "_strptime", "calendar", "pprint", "difflib", "pathlib",
            "shutil", "glob", "fnmatch", "csv", "tempfile", "locale", "codecs", "errno", "stat")


def _main():
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
    calls = [(func, ast.literal_eval(args), ast.literal_eval(kwargs)) for func, args, kwargs in cfg["calls"]]
    mb = 1 << 20
    limits = [(resource.RLIMIT_CPU, cfg["cpu_s"]), (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
              (resource.RLIMIT_FSIZE, cfg["file_size_mb"] * mb), (resource.RLIMIT_NOFILE, cfg["max_open_files"]),
              (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, cfg["max_procs"])]
    for which, value in limits:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing
    uid = cfg["uid"]
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    report("L")
    if cfg["audit_hook"]:
        sys.addaudithook(_make_hook(os.path.realpath(os.getcwd()), cfg["allow_processes"]))
    try:
        sys.set_int_max_str_digits(0)  # results are sent as decimal text, however long
    except AttributeError:
        pass

    class SandboxTimeout(BaseException):
        pass

    def on_alarm(signum, frame):
        raise SandboxTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    per_call, max_out = cfg["per_call_timeout_s"], cfg["max_output_chars"]
    ns = {"__name__": "__main__", "__builtins__": builtins}
    loaded = False
    try:
        code = compile(cfg["code"], "<solution>", "exec")
        signal.setitimer(signal.ITIMER_REAL, per_call)
        exec(code, ns)
        signal.setitimer(signal.ITIMER_REAL, 0)
        loaded = True
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        report("E " + type(e).__name__)
    report("S %d" % loaded)
    if loaded:
        for i, (func, args, kwargs) in enumerate(calls):
            try:
                signal.setitimer(signal.ITIMER_REAL, per_call)
                value = ns[func](*args, **kwargs)
                text = json.dumps(value, allow_nan=True)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except SandboxTimeout:
                report("X %d timeout" % i)
                continue
            except (TypeError, ValueError, RecursionError) as e:
                signal.setitimer(signal.ITIMER_REAL, 0)
                # TypeError from json.dumps (not JSON) or from the call itself: both are a failed case
                report("X %d %s" % (i, type(e).__name__))
                continue
            except BaseException as e:
                signal.setitimer(signal.ITIMER_REAL, 0)
                report("X %d %s" % (i, type(e).__name__))
                continue
            if len(text) > max_out:
                report("X %d too_long" % i)
            else:
                report("R %d %s" % (i, text))
    report("D")
    os._exit(0)


def _make_hook(root, allow_procs):
    """The in-process audit hook: friendly early refusals. It keeps no state, so there is no flag to switch off;
    the guarantees come from the kernel layers, not from this hook."""
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    proc_events = frozenset({"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
                             "subprocess.Popen", "pty.spawn", "os.startfile"})
    path_events = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                             "os.symlink", "os.truncate", "os.utime", "shutil.copyfile", "shutil.copymode",
                             "shutil.copystat", "shutil.copytree", "shutil.rmtree", "shutil.move", "shutil.chown",
                             "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod"})
    blocked_modules = ("ctypes", "_ctypes", "cffi", "_cffi_backend")
    realpath, isdir, fsdecode, getpid, sep = os.path.realpath, os.path.isdir, os.fsdecode, os.getpid, os.sep

    def inside(path):
        if isinstance(path, int):
            return True  # an already-open descriptor
        try:
            full = realpath(fsdecode(path))
        except Exception:
            return False
        return full == root or full.startswith(root + sep)

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags >= 0 and flags & write_flags)
            if writing and not inside(path):
                raise PermissionError("sandbox: writing outside the run directory is not allowed")
            if not isinstance(path, int) and not inside(path) and isdir(path):
                raise PermissionError("sandbox: opening directories outside the run directory is not allowed")
        elif event == "os.chdir":
            if args and (isinstance(args[0], int) or not inside(args[0])):
                raise PermissionError("sandbox: leaving the run directory is not allowed")
        elif event in path_events:
            for a in args:
                if isinstance(a, (str, bytes, os.PathLike)) and not inside(a):
                    raise PermissionError("sandbox: %s outside the run directory" % event)
        elif event.startswith("socket."):
            raise PermissionError("sandbox: network access is not allowed")
        elif event in proc_events and not allow_procs:
            raise PermissionError("sandbox: creating processes is not allowed")
        elif event in ("os.kill", "os.killpg"):
            if not (event == "os.kill" and args and args[0] == getpid()):
                raise PermissionError("sandbox: signalling other processes is not allowed")
        elif event == "import" and args and str(args[0]).split(".")[0] in blocked_modules:
            raise ImportError("sandbox: %s is not available" % args[0])
        elif event.startswith("ctypes.") or event == "sys.addaudithook":
            raise PermissionError("sandbox: %s is not allowed" % event)

    return hook


try:
    _main()
except BaseException:
    os._exit(1)
