"""The escapes of issue 11 against the code sandbox, in root mode and in non-root modes.

Each mode runs a trusted-side script in a fresh process (as root, or as `nobody` through setpriv, with the
system interpreter, which that user can read). The script holds a secret in its environment, a TCP
listener, a victim process of its own uid and a world-writable directory with a file in it; it scores
hostile code whose functions try to forge verdicts, switch the audit hook off, write outside, read the
parent's environment, connect, kill the parent and leave a daemon behind; then it reports what it saw.
The assertions are on what the trusted side observes, not on what the candidate claims.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM_PYTHON = "/usr/bin/python3"
SECRET = "hunter2-code-sandbox-secret"
IS_ROOT = os.geteuid() == 0

# Hostile code. Every function returns the list of attacks that got through (expected: []).
HOSTILE = r'''
import gc, os, sys, time, socket, signal

def hook_switched_off():
    """Reach the audit hook through gc and empty its rules (its closure cells), as frame tricks could."""
    hits = 0
    for obj in gc.get_objects():
        if type(obj).__name__ == "function" and obj.__name__ == "hook" and obj.__closure__:
            for name, cell in zip(obj.__code__.co_freevars, obj.__closure__):
                new = {"root": "/", "allow_procs": True, "proc_events": frozenset(), "path_events": frozenset(),
                       "blocked_modules": ()}.get(name, cell.cell_contents)
                cell.cell_contents = new
                hits += 1
    return hits > 0

def _try(label, fn, got):
    try:
        fn()
        got.append(label)
    except BaseException:
        pass

def write_outside():
    got = []
    here = os.getcwd()
    _try("open", lambda: open(OUTSIDE + "/a.txt", "w").write("x"), got)
    _try("os.open", lambda: os.close(os.open(OUTSIDE + "/b.txt", os.O_WRONLY | os.O_CREAT)), got)
    _try("mkdir", lambda: os.mkdir(OUTSIDE + "/d"), got)
    _try("remove", lambda: os.remove(OUTSIDE + "/victim.txt"), got)
    _try("rename", lambda: os.rename(OUTSIDE + "/victim.txt", OUTSIDE + "/moved.txt"), got)
    _try("truncate", lambda: open(OUTSIDE + "/victim.txt", "r+").truncate(0), got)
    _try("symlink", lambda: (os.symlink(OUTSIDE + "/c.txt", "link"), open("link", "w").write("x")), got)
    _try("dir_fd", lambda: os.close(os.open("e.txt", os.O_WRONLY | os.O_CREAT,
                                            dir_fd=os.open(OUTSIDE, os.O_RDONLY))), got)
    _try("chdir", lambda: (os.chdir(OUTSIDE), open("f.txt", "w").write("x")), got)
    os.chdir(here)
    _try("system", lambda: os.system("echo x > " + OUTSIDE + "/g.txt") == 0 and os.path.exists(OUTSIDE + "/g.txt")
         or 1 / 0, got)
    return [g for g in got if g != "system"] + (["system"] if os.path.exists(OUTSIDE + "/g.txt") else [])

def read_outside():
    got = []
    _try("read", lambda: open(OUTSIDE + "/victim.txt").read(), got)
    return got

def own_environ_clean():
    return not any(SECRET in v for v in os.environ.values()) and sorted(os.environ) == ["HOME", "LANG", "PATH", "TMPDIR"]

def environ_leak():
    found = []
    if any(SECRET in v for v in os.environ.values()):
        found.append("os.environ")
    paths = ["/proc/%d/environ" % TRAINER_PID, "/proc/%d/environ" % os.getppid()]
    try:
        paths += ["/proc/%s/environ" % p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pass
    for path in paths:
        try:
            with open(path, "rb") as f:
                if SECRET.encode() in f.read():
                    found.append(path)
        except OSError:
            pass
    return sorted(set(found))

def connect():
    got = []
    _try("socket", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=1).sendall(b"hi"), got)
    if ALLOW_PROCESSES:
        _try("child", lambda: os.system("%s -c \"import socket; socket.create_connection(('127.0.0.1', %d), "
                                        "timeout=1)\"" % (SANDBOX_PYTHON, PORT)) == 0 or 1 / 0, got)
    return got

def kill_others():
    got = []
    for target in (VICTIM_PID, TRAINER_PID, os.getppid()):
        if target > 1:
            _try("kill %d" % target, lambda: os.kill(target, signal.SIGKILL), got)
    _try("killpg", lambda: os.killpg(os.getpgid(VICTIM_PID), signal.SIGKILL), got)
    if ALLOW_PROCESSES:
        _try("child kill", lambda: _in_child(lambda: os.kill(VICTIM_PID, signal.SIGKILL)), got)
        _try("system kill", lambda: os.system("kill -9 %d" % VICTIM_PID) == 0 or 1 / 0, got)
    return got

def kill_everything():
    """kill(-1): every process this one may signal. Judged by the trusted side (victim and itself alive)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    return True

def _in_child(fn):
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError("the child's attempt failed")

def daemon():
    """A double-forked, setsid'd process running sleep with a unique argument."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", MARKER])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.3)
    return "spawned"
'''

# The trusted side, run in a fresh process (as root or as nobody). argv[1]: JSON of the run settings.
TRUSTED = r'''
import json, os, socket, subprocess, sys, tempfile, time, warnings
sys.path.insert(0, {repo!r})
from rewards.code_exec import ExecConfig, run_tests_detailed, SandboxWarning

settings = json.loads(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
srv.setblocking(False)
victim = subprocess.Popen(["sleep", "60"])
outside = tempfile.mkdtemp(prefix="outside-")
os.chmod(outside, 0o777)  # only the sandbox may stop writes here, not file permissions
with open(os.path.join(outside, "victim.txt"), "w") as f:
    f.write("keep")
os.chmod(os.path.join(outside, "victim.txt"), 0o666)
report = {{"runs": {{}}}}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for name, kwargs in settings["configs"]:
        cfg = ExecConfig(timeout_s=120.0, per_test_timeout_s=60.0, **kwargs)  # generous: verdicts, not speed
        allow = bool(kwargs.get("allow_processes"))
        marker = "%d.%d" % (os.getpid(), len(report["runs"]) + 1)
        prelude = ("OUTSIDE = %r\nTRAINER_PID = %d\nVICTIM_PID = %d\nPORT = %d\nSECRET = %r\nMARKER = %r\n"
                   "ALLOW_PROCESSES = %r\nSANDBOX_PYTHON = %r\n" % (outside, os.getpid(), victim.pid,
                   srv.getsockname()[1], settings["secret"], marker, allow, sys.executable))
        tests = settings["tests"] + (["assert daemon() == 'spawned'"] if allow else []) + (
            ["assert kill_everything()"] if settings["kill_all"] else [])
        r = run_tests_detailed(prelude + settings["code"], tests, cfg)
        deadline, daemons = time.monotonic() + 60, []  # a bound on the wait: daemons die within moments
        while time.monotonic() < deadline:
            daemons = []
            for p in os.listdir("/proc"):
                try:
                    with open("/proc/%s/cmdline" % p, "rb") as f:
                        if marker.encode() in f.read():
                            daemons.append(p)
                except OSError:
                    pass
            if not daemons:
                break
            time.sleep(0.1)
        report["runs"][name] = {{"passed": r.passed, "errors": r.case_errors, "error": r.error,
                                "loaded": r.loaded, "sandbox": r.sandbox, "daemons": daemons}}
report["warnings"] = [str(w.message) for w in caught if issubclass(w.category, SandboxWarning)]
connections = 0
while True:
    try:
        conn, _ = srv.accept()
        conn.close()
        connections += 1
    except BlockingIOError:
        break
report["connections"] = connections
report["victim_alive"] = victim.poll() is None
report["outside"] = sorted(os.listdir(outside))
try:
    with open(os.path.join(outside, "victim.txt")) as f:
        report["victim_text"] = f.read()
except OSError:
    report["victim_text"] = None
victim.kill()
print(json.dumps(report))
'''

TESTS = ["assert write_outside() == []", "assert read_outside() == []", "assert environ_leak() == []",
         "assert connect() == []", "assert kill_others() == []"]


def _trusted_run(user: str, configs: list, with_hook_attack: bool = True, tests=None, kill_all=True) -> dict:
    """Run the trusted script as `user` ("root" or "nobody"); returns its report."""
    tests = tests or (["assert hook_switched_off()"] if with_hook_attack else []) + TESTS
    settings = {"configs": configs, "code": HOSTILE, "tests": tests, "secret": SECRET, "kill_all": kill_all}
    script = TRUSTED.format(repo=REPO)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SECRET_TOKEN": SECRET, "HOME": "/tmp"}
    if user == "root":
        cmd = [sys.executable, "-c", script, json.dumps(settings)]
    else:
        cmd = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON, "-c",
               script, json.dumps(settings)]
    out = subprocess.run(cmd, env=env, cwd="/tmp", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]  # the trusted side was not killed
    return json.loads(out.stdout.strip().splitlines()[-1])


def _assert_contained(report: dict, names: list, hook_attack: bool = True):
    assert report["connections"] == 0
    assert report["victim_alive"]
    assert report["outside"] == ["victim.txt"] and report["victim_text"] == "keep"
    for name in names:
        run = report["runs"][name]
        n = len(TESTS) + (1 if hook_attack else 0)
        # Every attack function ran and returned [] (nothing got through); the daemon ran where allowed.
        assert run["loaded"], run
        assert run["passed"][:n] == [True] * n, run
        if len(run["passed"]) > n + 1:
            assert run["passed"][n], run  # the daemon really was spawned ...
        assert run["daemons"] == [], run  # ... and did not outlive the call


needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root to run the trusted side as root and as nobody")
needs_nobody = pytest.mark.skipif(not (IS_ROOT and os.path.exists(SYSTEM_PYTHON) and shutil.which("setpriv")),
                                  reason="needs root, setpriv and a system python to run as nobody")


@needs_root
def test_root_mode_contains_every_escape():
    report = _trusted_run("root", [["default", {}], ["processes", {"allow_processes": True}],
                                   ["no_hook", {"audit_hook": False, "allow_processes": True}]])
    _assert_contained(report, ["default", "processes"])
    no_hook = report["runs"]["no_hook"]
    assert no_hook["passed"][0] is False  # there was no hook to switch off ...
    report["runs"]["no_hook"]["passed"][0] = True  # ... and every other attack still failed:
    _assert_contained(report, ["no_hook"])
    layers = report["runs"]["default"]["sandbox"]
    assert layers["ns"] and not layers["user_ns"] and layers["dropped_uid"] and layers["seccomp"]
    assert layers["landlock"] >= 1
    assert report["warnings"] == []


@needs_nobody
def test_user_namespace_mode_contains_every_escape():
    report = _trusted_run("nobody", [["default", {}], ["processes", {"allow_processes": True}]])
    _assert_contained(report, ["default", "processes"])
    layers = report["runs"]["default"]["sandbox"]
    assert layers["ns"] and layers["user_ns"] and layers["caps_dropped"] and not layers["dropped_uid"]
    # Not root: said once, loudly.
    assert len(report["warnings"]) == 1 and "not root" in report["warnings"][0]


@needs_nobody
def test_no_namespace_mode_contains_every_escape():
    # What is left when unprivileged namespaces are unavailable: Landlock, seccomp, the supervisor.
    report = _trusted_run("nobody", [["default", {"namespaces": False}],
                                     ["processes", {"namespaces": False, "allow_processes": True}]])
    _assert_contained(report, ["default", "processes"])
    layers = report["runs"]["default"]["sandbox"]
    assert not layers["ns"] and layers["landlock"] >= 6 and layers["seccomp"]


@needs_nobody
def test_refuse_weak_mode_runs_nothing():
    report = _trusted_run("nobody", [["refused", {"namespaces": False, "refuse_weak": True}]], with_hook_attack=False)
    run = report["runs"]["refused"]
    assert run["error"].startswith("sandbox: refused") and not run["loaded"] and not any(run["passed"])


@needs_nobody
def test_without_kernel_layers_the_environment_is_still_clean_and_daemons_die():
    # Only the supervisor and the clean environment remain: the documented floor.
    kw = {"namespaces": False, "landlock": False, "seccomp": False, "audit_hook": False, "allow_processes": True}
    # (kill(-1) would kill the trusted side here: nothing stops signals to the same user in this mode.)
    report = _trusted_run("nobody", [["bare", kw]], tests=["assert own_environ_clean()"], kill_all=False)
    run = report["runs"]["bare"]
    assert run["passed"] == [True, True] and run["daemons"] == []  # clean; spawned, and killed with the run
    assert len(report["warnings"]) == 1


KILLED_PARENT = r'''
import os, sys, threading, time
sys.path.insert(0, {repo!r})
from rewards.code_exec import ExecConfig, run_tests

def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, tid)) as f:
                    kids = [int(x) for x in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out

code = "import time\ndef f():\n    time.sleep(60)\n    return 1"
cfg = ExecConfig(timeout_s=120, per_test_timeout_s=100, cpu_s=100, **{kwargs})
threading.Thread(target=run_tests, args=(code, ["assert f() == 1"], cfg), daemon=True).start()
end = time.monotonic() + 120  # until the supervisor and the runner are up, however busy the machine
while len(descendants(os.getpid())) < 2 and time.monotonic() < end:
    time.sleep(0.05)
time.sleep(0.5)  # the runner into the sleeping call (either way, both must die with this process)
print(" ".join(map(str, descendants(os.getpid()))), flush=True)
time.sleep(60)
'''


@pytest.mark.parametrize("user,kwargs", [("root", {}), ("nobody", {}), ("nobody", {"namespaces": False})],
                         ids=["root", "user_ns", "no_ns"])
def test_sandbox_dies_with_a_killed_parent(user, kwargs):
    if (user == "root" and not IS_ROOT) or (user == "nobody" and not (IS_ROOT and shutil.which("setpriv"))):
        pytest.skip("needs root")
    script = KILLED_PARENT.format(repo=REPO, kwargs=repr(kwargs))
    cmd = [sys.executable, "-c", script] if user == "root" else [
        shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON, "-c", script]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd="/tmp")
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) >= 2  # the supervisor and the runner (in the middle of the sleeping call)
        proc.kill()  # SIGKILL: no clean-up code of the parent runs
        proc.wait()
        deadline = time.monotonic() + 60  # a bound on the wait: they die within moments
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids)
    finally:
        proc.kill()


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
