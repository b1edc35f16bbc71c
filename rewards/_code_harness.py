"""The program that runs the candidate's code for rewards/code_exec.py (started by it; never import it).

Run as `python -I -S rewards/_code_harness.py` with a JSON payload on stdin; standard library only. Two
processes:

  supervisor  the process code_exec starts. It dies with its parent (PR_SET_PDEATHSIG), makes the
              namespaces (unshare: mount, network, pid; plus user when not root), becomes a child
              subreaper, forks the runner, enforces the wall-clock deadline and the total disk cap (it
              measures the run directory every DISK_POLL_S and once more at the end), and afterwards kills
              every process the run left behind. It never runs candidate code.
  runner      the forked child (pid 1 of the new pid namespace, so the kernel kills every process of the
              run when it exits). Before any candidate code: mounts a private /proc, sets the resource
              limits, switches to the run's private uid (as root) or drops every capability (in a user
              namespace), sets no_new_privs, installs Landlock (writes only in the run directory, reads only
              in system and Python directories, no TCP, no signals or abstract sockets outside the run) and a
              seccomp filter (no sockets, ptrace, mounts, namespaces, io_uring, ... and, unless processes are
              allowed, no fork/exec and no signals to other processes), reports which layers are active on
              the status pipe, closes it, then loads the code and calls the functions.

The runner only COMPUTES: for each call it writes the return value, serialised as JSON, to the result pipe.
It never sees an expected value and never decides whether a test passed: code_exec does that outside.
Everything here that lives in the runner's memory is reachable by the candidate (frames, gc); nothing in it
can grant anything, because every guarantee is held by the kernel once the layers are installed.
"""
import ast
import builtins
import json
import os
import resource
import select
import signal
import sys
import time

try:
    import ctypes
except ImportError:  # no kernel layers then; code_exec reports the weaker mode
    ctypes = None

# ------------------------------------------------------------------------------------------- constants
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAPBSET_DROP = 1, 38, 22, 24
PR_SET_CHILD_SUBREAPER, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 36, 47, 4
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_THREAD = 0x20000, 0x10000000, 0x20000000, 0x40000000, 0x10000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18

# Landlock (linux/landlock.h)
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
LL_FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
LL_REFER, LL_TRUNCATE, LL_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
LL_NET_BIND_TCP, LL_NET_CONNECT_TCP = 1, 2
LL_SCOPE_ABSTRACT_UNIX, LL_SCOPE_SIGNAL = 1, 2
SYS_LANDLOCK_CREATE, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT = 444, 445, 446
READ_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc", "/dev", "/proc", "/sys")

# seccomp, x86_64 only (other architectures run without this layer, and say so)
AUDIT_ARCH_X86_64 = 0xC000003E
X86_64 = {
    "socket": 41, "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "kill": 62, "ptrace": 101,
    "rt_sigqueueinfo": 129, "pivot_root": 155, "chroot": 161, "acct": 163, "mount": 165, "umount2": 166,
    "swapon": 167, "swapoff": 168, "reboot": 169, "init_module": 175, "delete_module": 176, "tkill": 200,
    "tgkill": 234, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
    "rt_tgsigqueueinfo": 297, "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320,
    "bpf": 321, "execveat": 322, "userfaultfd": 323, "pidfd_send_signal": 424, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438,
    "mount_setattr": 442,
}
ALWAYS_DENIED = ("socket", "ptrace", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pivot_root", "chroot", "acct",
                 "mount", "umount2", "swapon", "swapoff", "reboot", "init_module", "delete_module", "finit_module",
                 "kexec_load", "kexec_file_load", "add_key", "request_key", "keyctl", "unshare", "setns",
                 "perf_event_open", "name_to_handle_at", "open_by_handle_at", "process_vm_readv",
                 "process_vm_writev", "bpf", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
                 "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
                 "pidfd_open", "pidfd_send_signal", "pidfd_getfd")
PROCESS_CALLS = ("fork", "vfork", "execve", "execveat", "tkill")
EPERM, ENOSYS = 1, 38
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
BPF_LD_W_ABS, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06


# ------------------------------------------------------------------------------------------- syscalls
class _Sys:
    """Thin ctypes wrappers; every call raises OSError on failure."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long

    def _check(self, r):
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return r

    def prctl(self, op, a=0, b=0, c=0, d=0):
        u = ctypes.c_ulong
        return self._check(self.libc.prctl(ctypes.c_int(op), u(a), u(b), u(c), u(d)))

    def syscall(self, nr, *args):
        return self._check(self.libc.syscall(ctypes.c_long(nr), *args))

    def unshare(self, flags):
        return self._check(self.libc.unshare(ctypes.c_int(flags)))

    def mount(self, source, target, fstype, flags):
        return self._check(self.libc.mount(source, target, fstype, ctypes.c_ulong(flags), None))


def _write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------- supervisor
def main():
    start = time.monotonic()
    cfg = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdin.close()
    status_fd, result_fd = cfg["status_fd"], cfg["result_fd"]
    k = None
    if ctypes is not None:
        try:
            k = _Sys()
            k.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # die with code_exec's process
        except OSError:
            k = None
    if os.getppid() != cfg["parent_pid"]:
        os._exit(3)  # the parent died before the death signal was armed
    status = {"kernel_api": k is not None, "ns": False, "user_ns": False}
    real_uid, real_gid = os.getuid(), os.getgid()
    if k is not None and cfg["namespaces"]:
        user_ns = os.geteuid() != 0
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (CLONE_NEWUSER if user_ns else 0)
        try:
            k.unshare(flags)
            if user_ns:  # map root inside to our own uid / gid outside (what `unshare --map-root-user` does)
                _write_file("/proc/self/setgroups", "deny")
                _write_file("/proc/self/uid_map", "0 %d 1" % real_uid)
                _write_file("/proc/self/gid_map", "0 %d 1" % real_gid)
            k.mount(b"none", b"/", None, MS_REC | MS_PRIVATE)  # nothing mounted here leaks out
            status.update(ns=True, user_ns=user_ns)
        except OSError as e:
            status["ns_error"] = e.strerror
    if cfg["refuse_weak"] and not status["ns"]:
        _status(status_fd, "P", dict(status, refused=True))
        os._exit(4)
    try:
        if k is not None:
            k.prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the run come back here to be killed
    except OSError:
        pass
    _status(status_fd, "P", status)
    stdlib_fds = _open_stdlib_dirs() if cfg["uid"] is not None else {}
    calls = [(func, ast.literal_eval(args), ast.literal_eval(kwargs)) for func, args, kwargs in cfg["calls"]]
    supervisor = os.getpid()
    child = os.fork()
    if child == 0:
        try:
            _runner(cfg, k, status, calls, stdlib_fds, supervisor)
        finally:
            os._exit(1)
    os.close(result_fd)
    deadline = start + cfg["deadline_s"]
    code, timed_out, over_disk = _wait(child, deadline, cfg["workdir"], cfg["disk_mb"] << 20)
    _kill_descendants()
    over_disk = over_disk or _over_disk(cfg["workdir"], cfg["disk_mb"] << 20)  # what a daemon wrote meanwhile too
    _status(status_fd, "P", {"end": True, "exit": code, "timeout": timed_out, "disk": over_disk})
    os._exit(0)


def _status(fd, who, obj):
    try:
        os.write(fd, (who + " " + json.dumps(obj) + "\n").encode())
    except OSError:
        pass


def _open_stdlib_dirs():
    """Descriptors of the interpreter's library directories, opened while still privileged.

    After the switch to the run's uid, an install under a private directory (e.g. /root/.pyenv, mode 0700)
    cannot be reached by path; /proc/self/fd/N jumps straight into the directory, so imports keep working."""
    fds = {}
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            try:
                fds[entry] = os.open(entry, os.O_PATH | os.O_DIRECTORY)
            except OSError:
                pass
    return fds


DISK_POLL_S = 0.02  # how often the supervisor measures the run directory (RLIMIT_FSIZE caps each file meanwhile)
MAX_ENTRIES = 10_000  # files and directories the run may create in its directory


def _over_disk(root, cap_bytes):
    """Whether the run directory holds more than cap_bytes of allocated blocks, or more than MAX_ENTRIES entries
    (each file counts, so a flood of empty files cannot exhaust the inodes either)."""
    total, n, todo = 0, 0, [root]
    while todo:
        try:
            entries = os.scandir(todo.pop())
        except OSError:
            continue
        with entries:
            for e in entries:
                n += 1
                if n > MAX_ENTRIES:
                    return True
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if total > cap_bytes:
                    return True
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
    return False


def _kill_runner(child):
    try:
        os.kill(child, signal.SIGKILL)
    except OSError:
        pass
    os.waitpid(child, 0)


def _wait(child, deadline, root, cap_bytes):
    """(exit status, timed out, over the disk cap): waits for the runner until the deadline, measuring the run
    directory every DISK_POLL_S; SIGKILLs the runner at the deadline or as soon as it is over the cap."""
    try:
        pidfd = os.pidfd_open(child)
    except (AttributeError, OSError):
        pidfd = None
    while True:
        pid, st = os.waitpid(child, os.WNOHANG)
        if pid == child:
            if pidfd is not None:
                os.close(pidfd)
            return os.waitstatus_to_exitcode(st), False, False
        if _over_disk(root, cap_bytes):
            _kill_runner(child)
            return -9, False, True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _kill_runner(child)
            return -9, True, False
        if pidfd is not None:
            select.select([pidfd], [], [], min(remaining, DISK_POLL_S))
        else:
            time.sleep(min(remaining, 0.005))


def _children(pid):
    out = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return out


def _kill_descendants():
    """SIGKILL every process below this one (orphans were re-parented here) until none is left."""
    me = os.getpid()
    for _ in range(200):
        todo, seen = [me], []
        while todo:
            for c in _children(todo.pop()):
                if c not in seen:
                    seen.append(c)
                    todo.append(c)
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid <= 0:
                break
        if not seen:
            return
        time.sleep(0.002)


# ------------------------------------------------------------------------------------------- runner
def _runner(cfg, k, status, calls, stdlib_fds, supervisor):
    status_fd, result_fd, nonce = cfg["status_fd"], cfg["result_fd"], cfg["nonce"]
    layers = {}
    if k is not None:
        k.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() not in (supervisor, 0):  # 0: the supervisor is outside our pid namespace
            os._exit(3)
    if status["ns"]:
        try:
            k.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            layers["proc"] = True
        except OSError:
            layers["proc"] = False
    mb = 1 << 20
    for which, value in [(resource.RLIMIT_CPU, cfg["cpu_s"]), (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
                         (resource.RLIMIT_FSIZE, cfg["file_size_mb"] * mb),
                         (resource.RLIMIT_NOFILE, cfg["max_open_files"]), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NPROC, cfg["max_procs"])]:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing
    uid = cfg["uid"]
    layers["uid"] = os.getuid()
    if uid is not None and os.geteuid() == 0 and not status["user_ns"]:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # also clears every capability
        layers["uid"] = os.getuid()
        if k is not None:
            k.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a credential change clears it
        _use_stdlib_fds(stdlib_fds)
    layers["caps_dropped"] = _drop_capabilities(k) if os.geteuid() == 0 else True
    layers["no_new_privs"] = False
    if k is not None:
        try:
            k.prctl(PR_SET_NO_NEW_PRIVS, 1)
            layers["no_new_privs"] = True
        except OSError:
            pass
    layers["landlock"] = _landlock(k, cfg) if (k is not None and cfg["landlock"] and layers["no_new_privs"]) else 0
    layers["seccomp"] = (_seccomp(k, cfg["allow_processes"])
                         if (k is not None and cfg["seccomp"] and layers["no_new_privs"]) else False)
    _status(status_fd, "C", layers)
    os.close(status_fd)  # the candidate cannot speak on the trusted channel
    for fd in range(3, 256):  # nothing else of the supervisor's stays open
        if fd != result_fd and fd not in stdlib_fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
    for name in ("ctypes", "_ctypes", "ctypes._endian"):  # a fresh import meets the audit hook's refusal
        sys.modules.pop(name, None)
    _run_candidate(cfg, calls, result_fd, nonce)


def _use_stdlib_fds(stdlib_fds):
    """Point sys.path, and the __path__ of packages imported already, at the /proc/self/fd aliases."""
    aliases = {}
    for entry, fd in stdlib_fds.items():
        alias = "/proc/self/fd/%d" % fd
        if os.path.isdir(alias):
            aliases[entry] = alias

    def moved(path):
        for entry, alias in aliases.items():
            if path == entry or path.startswith(entry + os.sep):
                return alias + path[len(entry):]
        return path

    sys.path[:] = [moved(p) for p in sys.path]
    for module in list(sys.modules.values()):
        paths = getattr(module, "__path__", None)
        if isinstance(paths, list):
            paths[:] = [moved(p) if isinstance(p, str) else p for p in paths]
    sys.path_importer_cache.clear()


def _drop_capabilities(k):
    """Root inside a namespace (or root without a uid switch): give up every capability, for good."""
    if k is None:
        return False
    try:
        for cap in range(64):
            try:
                k.prctl(PR_CAPBSET_DROP, cap)
            except OSError:
                break  # past the last capability this kernel knows
        try:
            k.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
        except OSError:
            pass

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        header, data = Header(0x20080522, 0), (Data * 2)()
        k._check(k.libc.capset(ctypes.byref(header), ctypes.byref(data)))
        return True
    except OSError:
        return False


def _landlock(k, cfg):
    """Landlock ruleset; returns the ABI version used (0 when unavailable)."""
    try:
        abi = k.syscall(SYS_LANDLOCK_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except OSError:
        return 0
    fs = LL_FS_ABI1 | (LL_REFER if abi >= 2 else 0) | (LL_TRUNCATE if abi >= 3 else 0) | (
        LL_IOCTL_DEV if abi >= 5 else 0)
    net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP if abi >= 4 else 0
    scoped = LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL if abi >= 6 else 0

    class Attr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = Attr(fs, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = k.syscall(SYS_LANDLOCK_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    read = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR
    file_rights = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | (LL_TRUNCATE if abi >= 3 else 0)
    rules = [(p, read | (LL_IOCTL_DEV if (p == "/dev" and abi >= 5) else 0)) for p in READ_DIRS]
    rules += [(p, read) for p in sys.path if p and os.path.isdir(p)]  # the standard library (maybe via fds)
    rules += [(cfg["workdir"], fs), ("/dev/null", file_rights & fs)]
    try:
        for path, allowed in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not on this system
            try:
                if not os.path.isdir(path):
                    allowed &= file_rights
                rule = PathBeneath(allowed & fs, fd)
                k.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                          ctypes.c_uint32(0))
            finally:
                os.close(fd)
        k.syscall(SYS_LANDLOCK_RESTRICT, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    except OSError:
        return 0
    finally:
        os.close(ruleset)
    return abi


def _seccomp(k, allow_processes):
    """Install the seccomp filter (x86_64); True when installed."""
    if os.uname().machine != "x86_64":
        return False
    prog = []  # (code, jt label | int, jf label | int, k)
    prog += [(BPF_LD_W_ABS, 0, 0, 4), (BPF_JEQ, 1, 0, AUDIT_ARCH_X86_64), (BPF_RET, 0, 0, RET_KILL_PROCESS),
             (BPF_LD_W_ABS, 0, 0, 0), (BPF_JGE, "eperm", 0, 0x40000000)]  # x32 system calls: refused
    for name in ALWAYS_DENIED:
        prog.append((BPF_JEQ, "enosys" if name == "clone3" else "eperm", 0, X86_64[name]))
    if not allow_processes:
        for name in PROCESS_CALLS:
            prog.append((BPF_JEQ, "eperm", 0, X86_64[name]))
        # clone3 gets ENOSYS so that the C library falls back to clone, whose flags seccomp can see.
        prog.append((BPF_JEQ, "enosys", 0, X86_64["clone3"]))
        me = os.getpid()
        # clone: only threads. kill / tgkill: only this process.
        prog += [(BPF_JEQ, 0, 2, X86_64["clone"]), (BPF_LD_W_ABS, 0, 0, 16), (BPF_JSET, "allow", "eperm", CLONE_THREAD)]
        for name in ("kill", "tgkill"):
            prog += [(BPF_JEQ, 0, 2, X86_64[name]), (BPF_LD_W_ABS, 0, 0, 16), (BPF_JEQ, "allow", "eperm", me)]
    prog += [(BPF_RET, 0, 0, RET_ALLOW)]
    labels = {"allow": len(prog) - 1, "eperm": len(prog), "enosys": len(prog) + 1}
    prog += [(BPF_RET, 0, 0, RET_ERRNO | EPERM), (BPF_RET, 0, 0, RET_ERRNO | ENOSYS)]

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    def rel(target, i):
        return target if isinstance(target, int) else labels[target] - i - 1

    filters = (Filter * len(prog))(*[Filter(c, rel(jt, i), rel(jf, i), kk) for i, (c, jt, jf, kk) in enumerate(prog)])
    fprog = Prog(len(prog), filters)
    try:
        k.prctl(PR_SET_SECCOMP, 2, ctypes.addressof(fprog))
    except OSError:
        return False
    return True


def _run_candidate(cfg, calls, result_fd, nonce):
    def report(line):
        try:
            os.write(result_fd, (nonce + " " + line + "\n").encode())
        except OSError:
            pass

    report("L")
    if cfg["audit_hook"]:
        sys.addaudithook(_make_hook(cfg["workdir"], cfg["allow_processes"]))
    try:
        sys.set_int_max_str_digits(0)  # results are sent as decimal text, however long
    except AttributeError:
        pass

    class SandboxTimeout(BaseException):
        pass

    def on_alarm(signum, frame):
        raise SandboxTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    per_call, max_out, my_pid = cfg["per_call_timeout_s"], cfg["max_output_chars"], os.getpid()
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
    if os.getpid() != my_pid:
        os._exit(0)  # a forked child of the solution never reports
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
            except BaseException as e:  # the call raised, or the value is not JSON (TypeError)
                signal.setitimer(signal.ITIMER_REAL, 0)
                if os.getpid() != my_pid:
                    os._exit(0)
                report("X %d %s" % (i, type(e).__name__))
                continue
            if os.getpid() != my_pid:
                os._exit(0)
            report(("X %d too_long" % i) if len(text) > max_out else ("R %d %s" % (i, text)))
    report("D")
    os._exit(0)


def _make_hook(root, allow_procs):
    """The in-process audit hook: early, readable refusals. It keeps no state and is not a guarantee (the
    candidate can reach it through gc or frames); the kernel layers above are."""
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
                # A directory descriptor from outside would allow os.open(name, dir_fd=...) there.
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


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        os._exit(1)
