"""Tests for rewards.code_exec: rewards for correct / partial code, and containment of hostile code."""
import glob
import os
import socket
import time

import pytest

from rewards.code_exec import (ExecConfig, run_function_tests, run_function_tests_detailed, run_tests,
                               run_tests_detailed)

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]
# Limits a correct run never meets, even on a busy machine (a 0.5 s per-call limit once failed the suite at load
# 2.5-4): every test below that checks a verdict uses these. The limits themselves are tested with SHORT, in the
# tests marked `timing`, whose verdicts hold at any speed (a loop that never ends always meets its limit) and
# whose wall-clock bounds are generous.
CFG = ExecConfig(timeout_s=60.0, per_test_timeout_s=30.0)
SHORT = ExecConfig(timeout_s=4.0, per_test_timeout_s=0.5)
WALL_BOUND_S = 60.0  # "it was stopped": far above the limits, far below forever
IS_ROOT = os.geteuid() == 0


def _sandbox_uid_processes():
    """Pids of processes running under one of this test process's sandbox uids (other test workers have theirs)."""
    lo = (1 << 28) + ((os.getpid() & 0x3FFFFF) << 6)
    out = []
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if lo <= int(line.split()[1]) < lo + 64:
                            out.append(status.split("/")[2])
                        break
        except OSError:
            continue
    return out


def test_correct_solution_scores_one():
    assert run_tests("def add(a, b):\n    return a + b", ADD_TESTS, CFG) == 1.0


def test_partial_solution_scores_share():
    # Wrong whenever a == b: passes add(1,2), add(-1,1); fails add(0,0), add(2,2).
    code = "def add(a, b):\n    return a + b if a != b else -1"
    r = run_tests_detailed(code, ADD_TESTS, CFG)
    assert r.passed == [True, False, True, False] and r.fraction == 0.5 and r.loaded


def test_single_test_string_and_helpers():
    code = "import math\nfrom collections import Counter\ndef f(xs):\n    return Counter(xs).most_common(1)[0][0]"
    assert run_tests(code, "assert f([1, 2, 2]) == 2", CFG) == 1.0


@pytest.mark.parametrize("code,error", [
    ("def add(a, b) return a + b", "SyntaxError"),
    ("raise ValueError('at load')", "ValueError"),
    ("import sys\nsys.exit(0)", "SystemExit"),
])
def test_solution_that_does_not_load(code, error):
    r = run_tests_detailed(code, ADD_TESTS, CFG)
    assert r.fraction == 0.0 and not r.loaded and r.error == error


def test_exit_codes_are_not_trusted():
    assert run_tests("import os\nos._exit(0)", ADD_TESTS, CFG) == 0.0
    # Exiting inside a test ends the run: that test and the later ones do not pass.
    code = "import os\ndef add(a, b):\n    os._exit(0)"
    assert run_tests(code, ADD_TESTS, CFG) == 0.0


def test_forged_reports_are_ignored():
    # Lines without the run's nonce are ignored, whatever pipe they are written to.
    code = ("import os\nfor fd in range(3, 30):\n    try:\n        os.write(fd, b'x R 0 3\\nx R 1 0\\nx R 3 4\\n')\n"
            "    except OSError:\n        pass\ndef add(a, b):\n    return 0")
    r = run_tests_detailed(code, ADD_TESTS, CFG)
    assert r.passed == [False, True, True, False]  # only add(0, 0) and add(-1, 1) are really 0


def test_forked_children_do_not_report():
    code = "import os\nif os.fork() == 0:\n    pass\ndef add(a, b):\n    return 0"
    cfg = ExecConfig(timeout_s=60.0, per_test_timeout_s=30.0, allow_processes=True)
    assert run_tests_detailed(code, ADD_TESTS, cfg).passed == [False, True, True, False]


@pytest.mark.parametrize("bad", [None, 12, b"def add(a,b): return a+b"])
def test_bad_inputs_never_raise(bad):
    assert run_tests(bad, ADD_TESTS, CFG) == 0.0
    assert run_tests("x = 1", bad, CFG) == 0.0 if bad is not None else True


def test_no_tests_and_too_long():
    assert run_tests_detailed("x = 1", [], CFG).error == "no tests"
    r = run_tests_detailed("x = 1" + " " * 300_000, ADD_TESTS, CFG)
    assert r.fraction == 0.0 and r.error == "too long"


@pytest.mark.timing
def test_infinite_loop_in_function_times_out_per_test():
    code = "def add(a, b):\n    while True:\n        pass"
    t0 = time.monotonic()
    r = run_tests_detailed(code, ADD_TESTS[:2], SHORT)
    assert r.fraction == 0.0 and r.loaded and r.case_errors == ["timeout"] * 2
    assert time.monotonic() - t0 < WALL_BOUND_S


@pytest.mark.timing
def test_loop_that_swallows_the_alarm_hits_wall_timeout():
    code = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"
    cfg = ExecConfig(timeout_s=1.5, per_test_timeout_s=0.3)
    t0 = time.monotonic()
    r = run_tests_detailed(code, ADD_TESTS, cfg)
    assert r.fraction == 0.0 and r.timed_out and r.error == "timeout"
    assert time.monotonic() - t0 < WALL_BOUND_S


@pytest.mark.timing
def test_gil_holding_c_loop_is_killed():
    t0 = time.monotonic()
    r = run_tests_detailed("x = pow(3, 10**9)", ADD_TESTS, ExecConfig(timeout_s=1.5, per_test_timeout_s=0.5))
    assert r.fraction == 0.0 and time.monotonic() - t0 < WALL_BOUND_S


def test_fork_bomb_blocked_by_default():
    r = run_tests_detailed("import os\nwhile True:\n    os.fork()", ADD_TESTS, CFG)
    assert r.fraction == 0.0 and r.error == "PermissionError"


@pytest.mark.timing
def test_fork_bomb_contained_when_processes_allowed():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    cfg = ExecConfig(timeout_s=1.5, per_test_timeout_s=0.5, allow_processes=True, max_procs=8)
    t0 = time.monotonic()
    r = run_tests_detailed(code, ADD_TESTS, cfg)
    assert r.fraction == 0.0 and time.monotonic() - t0 < WALL_BOUND_S
    if IS_ROOT:
        deadline = time.monotonic() + WALL_BOUND_S  # a bound on the wait, not the verdict: nothing may be left
        while _sandbox_uid_processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sandbox_uid_processes() == []


@pytest.mark.parametrize("code", [
    "x = bytearray(10**10)",
    "x = []\nwhile True:\n    x.append(' ' * 10**7)",
])
def test_memory_bomb(code):
    r = run_tests_detailed(code + "\ndef add(a, b):\n    return a + b", ADD_TESTS, CFG)
    assert r.fraction == 0.0 and r.error == "MemoryError"


def test_limits_are_set_inside():
    cfg = ExecConfig(timeout_s=60.0, per_test_timeout_s=30.0, memory_mb=256, file_size_mb=1, cpu_s=3)
    code = ("import os, sys, errno, resource\n"
            "def big_write():\n    try:\n        with open('big.bin', 'wb') as f:\n"
            "            f.write(b'0' * (2 << 20))\n    except OSError as e:\n        return errno.errorcode[e.errno]\n"
            "    return 'wrote'\n"
            "def limit(name):\n    return resource.getrlimit(getattr(resource, name))[0]\n"
            "def env_ok():\n    return set(os.environ) <= {'PATH', 'LANG', 'LC_CTYPE', 'TMPDIR', 'HOME'}\n"
            "def cwd():\n    return os.path.basename(os.getcwd())[:8]\n"
            "def flags():\n    return [sys.flags.isolated, sys.flags.no_site]\n")
    tests = ["assert limit('RLIMIT_AS') == 268435456", "assert limit('RLIMIT_FSIZE') == 1048576",
             "assert limit('RLIMIT_CPU') == 3", "assert env_ok() is True", "assert cwd() == 'codeexec'",
             "assert flags() == [1, 1]", "assert big_write() == 'EFBIG'"]
    r = run_tests_detailed(code, tests, cfg)
    assert r.passed == [True] * len(tests), (r, r.stderr_tail)


DISK_HOG = ("def f(n):\n    for i in range(n):\n        with open('f%d' % i, 'wb') as fh:\n"
            "            fh.write(b'x' * (4 << 20))\n    return n\n")


def test_total_disk_use_is_capped():
    # The probe: no total cap, 927 MB written in 1.8 s (RLIMIT_FSIZE caps one file only). 8 files of 4 MB against a
    # 16 MB cap: killed (or flagged by the final check), score 0; 2 files fit and score normally.
    cfg = ExecConfig(timeout_s=60.0, per_test_timeout_s=30.0, disk_mb=16)
    r = run_function_tests_detailed(DISK_HOG, "f", [([8], 8)], cfg)
    assert r.fraction == 0.0 and r.error.startswith("disk") and r.sandbox.get("disk") is True
    ok = run_function_tests_detailed(DISK_HOG, "f", [([2], 2)], cfg)
    assert ok.fraction == 1.0 and not ok.error


def test_a_flood_of_empty_files_is_capped():
    code = "def f():\n    for i in range(20_000):\n        open('e%d' % i, 'w').close()\n    return 1\n"
    r = run_function_tests_detailed(code, "f", [([], 1)], ExecConfig(timeout_s=60.0, per_test_timeout_s=30.0))
    assert r.fraction == 0.0 and r.error.startswith("disk")


def test_workdir_removed_after_run():
    code = ("import os, sys\nopen('inside.txt', 'w').write('ok')\nsys.stderr.write('CWD=' + os.getcwd() + '\\n')\n"
            "def add(a, b):\n    return a + b")
    r = run_tests_detailed(code, ADD_TESTS, CFG)
    assert r.fraction == 1.0
    cwd = r.stderr_tail.split("CWD=")[1].split()[0]
    assert os.path.basename(cwd).startswith("codeexec-")
    assert not os.path.exists(cwd)


# Each kernel layer alone (the others switched off) must hold its promise; ALL = the default.
ALL = CFG
OFF = dict(timeout_s=60.0, per_test_timeout_s=30.0, namespaces=False, drop_privileges=False, landlock=False,
           seccomp=False, audit_hook=False)
LANDLOCK_ONLY = ExecConfig(**{**OFF, "landlock": True})
SECCOMP_ONLY = ExecConfig(**{**OFF, "seccomp": True})
NAMESPACES_ONLY = ExecConfig(**{**OFF, "namespaces": True})
UID_ONLY = ExecConfig(**{**OFF, "drop_privileges": True})
HOOK_ONLY = ExecConfig(**{**OFF, "audit_hook": True})


@pytest.mark.parametrize("cfg", [ALL, LANDLOCK_ONLY, HOOK_ONLY] + ([UID_ONLY] if IS_ROOT else []),
                         ids=["all", "landlock", "hook"] + (["uid"] if IS_ROOT else []))
def test_write_outside_is_contained(tmp_path, cfg):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("keep")
    target = outside / "pwned.txt"
    out, tgt, vic = str(outside), str(target), str(victim)
    code = (f"import os\nhere = os.getcwd()\nfor op in (lambda: open({tgt!r}, 'w').write('x'),\n"
            f"           lambda: os.close(os.open({tgt!r}, os.O_WRONLY | os.O_CREAT)),\n"
            f"           lambda: os.remove({vic!r}),\n"
            f"           lambda: os.rename({vic!r}, {tgt!r}),\n"
            f"           lambda: (os.symlink({tgt!r}, 'link'), open('link', 'w').write('x')),\n"
            f"           lambda: os.open('pwned.txt', os.O_WRONLY | os.O_CREAT, dir_fd=os.open({out!r}, os.O_RDONLY)),\n"
            f"           lambda: (os.chdir({out!r}), open('pwned.txt', 'w').write('x')),\n"
            f"           lambda: (os.fchdir(os.open({out!r}, os.O_RDONLY)), open('pwned.txt', 'w').write('x'))):\n"
            "    try:\n        op()\n    except OSError:\n        pass\n    os.chdir(here)\n"
            "open('inside.txt', 'w').write('fine')\ndef add(a, b):\n    return a + b")
    r = run_tests_detailed(code, ADD_TESTS, cfg)
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert victim.read_text() == "keep"
    assert r.loaded and r.fraction == 1.0  # writing inside its own directory works


def test_write_outside_succeeds_with_every_layer_off(tmp_path):
    # The control for the test above: with no layer, the same kind of write does happen.
    target = tmp_path / "pwned.txt"
    code = f"open({str(target)!r}, 'w').write('x')\ndef add(a, b):\n    return a + b"
    assert run_tests(code, ADD_TESTS, ExecConfig(**OFF)) == 1.0 and target.exists()


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.3)
    yield srv
    srv.close()


def _connect_code(port):
    return (f"import socket\ndef connect():\n    try:\n"
            f"        socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
            "        return 'connected'\n    except OSError as e:\n        return type(e).__name__")


def _connections(srv):
    n = 0
    while True:
        try:
            conn, _ = srv.accept()
        except (socket.timeout, TimeoutError):
            return n
        conn.close()
        n += 1


@pytest.mark.parametrize("cfg", [ALL, SECCOMP_ONLY, NAMESPACES_ONLY, LANDLOCK_ONLY, HOOK_ONLY],
                         ids=["all", "seccomp", "namespaces", "landlock", "hook"])
def test_network_blocked(listener, cfg):
    r = run_tests_detailed(_connect_code(listener.getsockname()[1]), ["assert connect() != 'connected'"], cfg)
    assert r.passed == [True], r  # the function ran, and its connection failed
    assert _connections(listener) == 0


def test_network_open_with_every_layer_off(listener):
    r = run_tests_detailed(_connect_code(listener.getsockname()[1]), ["assert connect() == 'connected'"],
                           ExecConfig(**OFF))
    assert r.passed == [True] and _connections(listener) == 1


@pytest.mark.parametrize("cfg", [SECCOMP_ONLY, HOOK_ONLY], ids=["seccomp", "hook"])
@pytest.mark.parametrize("call", ["os.fork()", "os.execv('/bin/true', ['true'])",
                                  "__import__('subprocess').run(['true'])"])
def test_process_creation_refused(cfg, call):
    r = run_tests_detailed(f"import os\n{call}\ndef add(a, b):\n    return a + b", ADD_TESTS, cfg)
    assert not r.loaded and r.error == "PermissionError", r


@pytest.mark.parametrize("cfg,ran", [(SECCOMP_ONLY, False), (ExecConfig(**OFF), True)], ids=["seccomp", "off"])
def test_shell_command_does_not_run(cfg, ran):
    code = "import os\ndef shell():\n    os.system('echo hi > made.txt')\n    return os.path.exists('made.txt')"
    assert run_tests_detailed(code, [f"assert shell() is {ran}"], cfg).passed == [True]


def test_standard_library_imports_after_the_uid_switch():
    # Here the interpreter lives under /root (mode 0700), which the run's private uid cannot enter: the
    # harness reaches the library through directory descriptors it opened before the switch.
    code = ("import subprocess, socket, asyncio, sqlite3, uuid, urllib.request, xml.etree.ElementTree, "
            "concurrent.futures, email.mime.text, multiprocessing, zoneinfo\ndef add(a, b):\n    return a + b")
    r = run_tests_detailed(code, ADD_TESTS, CFG)
    assert r.loaded and r.fraction == 1.0, (r.error, r.stderr_tail)
    assert r.sandbox["dropped_uid"] == IS_ROOT


def test_reads_limited_to_system_and_python_directories(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    os.chmod(tmp_path, 0o755)
    os.chmod(secret, 0o644)  # readable by anyone: only Landlock hides it
    code = (f"def peek():\n    try:\n        return open({str(secret)!r}).read()\n    except OSError as e:\n"
            "        return type(e).__name__\ndef lib():\n    import os\n    return len(os.listdir('/usr/lib')) > 0")
    r = run_tests_detailed(code, ["assert peek() == 'PermissionError'", "assert lib()"], LANDLOCK_ONLY)
    assert r.passed == [True, True], r


def test_broken_interpreter_reports_error():
    r = run_tests_detailed("def add(a, b):\n    return a + b", ADD_TESTS, ExecConfig(python="/nonexistent/python3"))
    assert r.fraction == 0.0 and r.error and not r.loaded


def test_ctypes_refused_by_the_hook():
    r = run_tests_detailed("import ctypes\ndef add(a, b):\n    return a + b", ADD_TESTS, CFG)
    assert r.fraction == 0.0 and r.error == "ImportError"


def test_layers_reported():
    r = run_tests_detailed("def add(a, b):\n    return a + b", ADD_TESTS, CFG)
    layers = r.sandbox
    assert layers["ns"] and layers["seccomp"] and layers["landlock"] >= 1 and layers["no_new_privs"]
    assert layers["caps_dropped"] and layers["dropped_uid"] == IS_ROOT and layers["user_ns"] == (not IS_ROOT)


@pytest.mark.parametrize("kwargs,field", [
    ({"timeout_s": 0}, "timeout_s"), ({"per_test_timeout_s": -1}, "per_test_timeout_s"), ({"cpu_s": 0}, "cpu_s"),
    ({"memory_mb": 10}, "memory_mb"), ({"max_procs": 1.5}, "max_procs"), ({"allow_processes": "yes"}, "allow_processes"),
    ({"python": 3}, "python"), ({"landlock": 1}, "landlock"), ({"seccomp": None}, "seccomp"),
    ({"namespaces": "no"}, "namespaces"), ({"refuse_weak": 0}, "refuse_weak"), ({"max_output_chars": 0}, "max_output_chars"),
])
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ExecConfig(**kwargs)


# ---------------------------------------------------------------------------------- value-based verdicts

def test_function_cases_compared_on_trusted_side():
    code = "def add(a, b):\n    return a + b"
    assert run_function_tests(code, "add", [([1, 2], 3), ([2, 2], 5)], CFG) == 0.5
    r = run_function_tests_detailed(code, "add", [([[1], [2]], [1, 2]), (["a", "b"], "ab"), ([0.5, 0.25], 0.75)], CFG)
    assert r.passed == [True, True, True] and r.case_errors == ["", "", ""]


def test_tuples_and_keys_normalised_like_json():
    code = "def f(x):\n    return (x, {1: x})"
    assert run_function_tests(code, "f", [([2], (2, {1: 2})), ([2], [2, {"1": 2}])], CFG) == 1.0


def test_always_equal_object_fails():
    code = ("class AlwaysEqual:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
            "        return False\ndef add(a, b):\n    return AlwaysEqual()")
    r = run_tests_detailed(code, ["assert add(2, 2) == 5", "assert add(1, 1) != 2"], CFG)
    assert r.passed == [False, False] and r.case_errors == ["TypeError", "TypeError"]
    assert run_function_tests(code, "add", [([2, 2], 5)], CFG) == 0.0
    # An int subclass with a lying __eq__ is sent as its integer value: 4 is not 5.
    code = "class Liar(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Liar(a + b)"
    assert run_tests_detailed(code, ["assert add(2, 2) == 5", "assert add(2, 2) == 4"], CFG).passed == [False, True]


def test_statement_forms():
    code = "import math\ndef f(x, scale=1):\n    return x * scale\ndef g(x):\n    return x > 0\ndef h():\n    return None"
    tests = ["assert f(2) == 2", "assert 6 == f(2, scale=3)", "assert f(-1) != 1", "assert g(1) is True",
             "assert g(1)", "assert not g(-1)", "assert h() is None", "assert math.isclose(f(0.1, 3), 0.3)",
             "assert math.isclose(f(1.0), 1.001, rel_tol=0.01)", "assert f((1, 2)) == [1, 2]", "assert f('ab', 2) == 'abab'"]
    r = run_tests_detailed(code, tests, CFG)
    assert r.passed == [True] * len(tests), r


@pytest.mark.parametrize("test", ["x = f(1)\nassert x == 1", "assert f(g(1)) == 1", "assert f(1) == x",
                                  "assert set(f(1)) == {1}", "f(1)", "assert f(1) < 2", "assert obj.f(1) == 2"])
def test_unsupported_statement_refused(test):
    r = run_tests_detailed("def f(x):\n    return x", ["assert f(1) == 1", test], CFG)
    assert r.fraction == 0.0 and r.error.startswith("unsupported test: test 1") and not r.loaded


@pytest.mark.parametrize("cases", [[([1], {1, 2})], [(3, 3)], [([float("nan")], 1)], [([1], object())]])
def test_bad_cases_never_raise(cases):
    r = run_function_tests_detailed("def f(x):\n    return x", "f", cases, CFG)
    assert r.fraction == 0.0 and r.error.startswith("bad cases")


def test_long_integer_results():
    code = "def f(n):\n    return 3 ** n"
    assert run_function_tests(code, "f", [([20000], 3 ** 20000), ([20000], 3 ** 20000 + 1)], CFG) == 0.5


def test_frame_access_cannot_forge_a_verdict():
    # The candidate walks up to the harness's frame and calls its report function with forged lines: old-style
    # pass flags, "true", 1 and an early "done". Only values can be sent, and the expected values are not in
    # its process, so cases 0-2 fail; case 3 (not forged) shows the harness's report function was reached.
    code = ("import sys\ndef add(a, b):\n    f, found = sys._getframe(1), False\n    while f is not None:\n"
            "        rep = f.f_locals.get('report')\n        if callable(rep):\n            found = True\n"
            "            for i in range(3):\n                rep('T %d 1' % i)\n                rep('R %d true' % i)\n"
            "                rep('R %d 1' % i)\n            rep('D')\n        f = f.f_back\n"
            "    return -1 if found else -2")
    cases = [([2, 2], 4), ([1, 1], 2), ([0, 0], 0), ([9, 9], -1)]
    r = run_function_tests_detailed(code, "add", cases, CFG)
    assert r.passed == [False, False, False, True], r
