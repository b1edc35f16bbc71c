"""Tests for rewards.pool: parallel scoring equals in-process scoring; hangs and crashes are contained."""
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from rewards.combine import RESULT_KEYS, RewardConfig, score
from rewards.pool import RewardPool

TEXTS = [
    "步骤一：3+4=7\n步骤二：7×2=14\n答案：14",
    "步骤一：3+4=8\n答案：8",
    "Step 1: 2 * 3 = 6\nAnswer: 6",
    "答案：\\boxed{\\frac{1}{2}}",
    "",
    "\\boxed{" * 1000,
    "the answer is " * 50,
]
GOLDS = ["14", "7", "6", "0.5", "1", "1", "3"]


# Score functions the workers import by name (module-level, picklable). The gold string carries the command.
def hostile_score(text, gold, cfg, n_tokens=None):
    if text == "HANG":
        time.sleep(3600)
    if text == "SPIN":  # holds the GIL in C code: only SIGKILL stops it
        pow(3, 10**9)
    if text == "EXIT":
        os._exit(3)
    if text == "SEGV":
        os.kill(os.getpid(), signal.SIGSEGV)
    if text == "RAISE":
        raise RuntimeError("boom")
    if text == "TMPHANG":  # what a killed code run leaves: a directory under the worker's TMPDIR, then a hang
        import tempfile

        d = tempfile.mkdtemp(prefix="codeexec-")
        with open(os.path.join(d, "big"), "wb") as f:
            f.write(b"x" * 100_000)
        with open(gold, "w") as f:
            f.write(d)
        time.sleep(3600)
    if text == "PID":
        with open(gold, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)
    return score(text, gold, cfg, n_tokens=n_tokens)


# Deadlines a correct item never meets, even on a busy machine: the tests of what the pool computes use `pool`.
# The deadline itself is tested with `short_pool` (tests marked `timing`): a hung item always meets it, and the
# ordinary items beside it have seconds to spare; wall-clock bounds there are generous (WALL_BOUND_S).
WALL_BOUND_S = 120.0


@pytest.fixture(scope="module")
def pool():
    cfg = RewardConfig(w_process=0.2, verify_timeout=20.0)
    with RewardPool(n_workers=2, timeout=60.0, cfg=cfg, score_fn=hostile_score) as p:
        yield p


@pytest.fixture(scope="module")
def short_pool():
    cfg = RewardConfig(w_process=0.2, verify_timeout=2.0)
    with RewardPool(n_workers=2, timeout=5.0, cfg=cfg, score_fn=hostile_score) as p:
        yield p


def test_matches_in_process(pool):
    cfg = pool.cfg
    texts, golds = TEXTS * 5, GOLDS * 5
    got = pool.score_batch(texts, golds)
    assert got == [score(t, g, cfg) for t, g in zip(texts, golds)]
    assert all(set(r) == set(RESULT_KEYS) for r in got)


def test_n_tokens_passed_through():
    cfg = RewardConfig(overlong_max_len=100, overlong_buffer=50)
    with RewardPool(n_workers=1, timeout=WALL_BOUND_S, cfg=cfg) as p:
        r = p.score_batch([TEXTS[0]] * 3, ["14"] * 3, n_tokens=[10, 75, 500])
    assert [x["overlong"] for x in r] == [0.0, 0.5, 1.0]


@pytest.mark.timing
@pytest.mark.parametrize("bad,kind", [("HANG", "timeout"), ("SPIN", "timeout"), ("EXIT", "crash"),
                                      ("SEGV", "crash"), ("RAISE", "RuntimeError")])
def test_bad_item_is_contained(short_pool, bad, kind):
    pool = short_pool
    before = pool.stats()
    texts = TEXTS[:3] + [bad] + TEXTS[:3]
    golds = GOLDS[:3] + ["0"] + GOLDS[:3]
    t0 = time.monotonic()
    got = pool.score_batch(texts, golds)
    assert time.monotonic() - t0 < WALL_BOUND_S
    assert got[3]["error"] == 1 and got[3]["total"] == 0.0 and got[3]["error_kind"] == kind
    ok = [r for i, r in enumerate(got) if i != 3]
    assert all(r["error"] == 0 for r in ok)
    assert [r["total"] for r in ok] == [score(t, g, pool.cfg)["total"] for t, g in zip(TEXTS[:3] * 2, GOLDS[:3] * 2)]
    after = pool.stats()
    assert after["errors"] == before["errors"] + 1
    if kind in ("timeout", "crash"):
        assert after["restarts"] > before["restarts"]
    # The pool keeps working at full strength afterwards.
    assert [r["error"] for r in pool.score_batch(TEXTS, GOLDS)] == [0] * len(TEXTS)


def _group_gone(pgid, wait_s=WALL_BOUND_S):
    """Whether no process (worker or its sympy child) is left in the group, allowing time for reaping."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timing
def test_a_killed_workers_directory_is_removed_by_the_parent(tmp_path):
    # The probe: each item killed at the pool's deadline left its code-exec directory behind (one held 1.0 GB).
    note = tmp_path / "where"
    with RewardPool(n_workers=1, timeout=5.0, cfg=RewardConfig(verify_timeout=0.5), score_fn=hostile_score) as p:
        got = p.score_batch(["TMPHANG", TEXTS[2]], [str(note), GOLDS[2]])
        assert got[0]["error_kind"] == "timeout" and got[1]["error"] == 0
        left = note.read_text()
        worker_tmp = os.path.dirname(left)
        assert os.path.basename(worker_tmp).startswith("reward-worker-")
        assert not os.path.exists(left) and not os.path.exists(worker_tmp)  # removed before the result came back
        tmps = [w.tmp for w in p._workers]
    assert tmps and not any(os.path.exists(t) for t in tmps)  # a closed pool leaves no worker directory either


def test_a_new_pool_removes_what_a_killed_owner_left(tmp_path):
    # A SIGKILLed trainer cannot remove its workers' directories; the next pool removes those of dead owners.
    import tempfile

    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid belongs to no process now
    left = tempfile.mkdtemp(prefix=f"reward-worker-{dead.pid}-")
    open(os.path.join(left, "file"), "w").close()
    mine = tempfile.mkdtemp(prefix=f"reward-worker-{os.getpid()}-")  # a live owner's: kept
    try:
        with RewardPool(n_workers=1, timeout=WALL_BOUND_S) as p:
            assert p.score_batch([TEXTS[2]], [GOLDS[2]])[0]["error"] == 0
        assert not os.path.exists(left) and os.path.exists(mine)
    finally:
        os.rmdir(mine)


def test_the_pool_deadline_covers_the_code_sandbox():
    # The probe: run.reward_timeout 2 s against the sandbox's 10 s: correct code needing 2-10 s scored 0.
    from rewards.code_exec import ExecConfig, wall_limit_s
    from rl import config_validation as cv
    from rl.setup import reward_deadline

    cfg = cv.typed({"run": {"reward_timeout": 2.0}})
    code = types.SimpleNamespace(reward="code")
    math = types.SimpleNamespace(reward="math")
    assert wall_limit_s() >= ExecConfig().timeout_s + 3.0
    assert reward_deadline(cfg, [math, code]) == wall_limit_s()
    assert reward_deadline(cfg, [math]) == 2.0  # math only: the configured deadline
    assert reward_deadline(cfg) == wall_limit_s()  # problems unknown: assume code may come
    assert reward_deadline(cv.typed({"run": {"reward_timeout": 60.0}}), [code]) == 60.0


@pytest.mark.timing
@pytest.mark.timing
def test_correct_code_that_needs_seconds_scores_one_through_the_pool():
    # End to end through rl.setup's deadline and the real code reward: four calls of 1.2 s each (under the
    # sandbox's 2 s per call, about 5 s in all) used to meet the pool's 2 s deadline and score 0.
    import json as _json

    from rewards.task_score import score_task, target_of
    from rl import config_validation as cv
    from rl.setup import reward_deadline

    check = _json.dumps({"func": "slow_add", "tests": [[[1, 2], 3], [[0, 0], 0], [[2, 2], 4], [[5, 5], 10]]})
    text = "```python\nimport time\ndef slow_add(a, b):\n    time.sleep(1.2)\n    return a + b\n```"
    deadline = reward_deadline(cv.typed({"run": {"reward_timeout": 2.0}}), [types.SimpleNamespace(reward="code")])
    with RewardPool(n_workers=1, timeout=deadline, score_fn=score_task) as p:
        got = p.score_batch([text], [target_of("code", "", check)])
    assert got[0]["error_kind"] == "" and got[0]["outcome"] == 1.0, got[0]


def test_killed_worker_group_is_gone(short_pool, tmp_path):
    pid_file = tmp_path / "pid"
    got = short_pool.score_batch(["PID"], [str(pid_file)])
    assert got[0]["error_kind"] == "timeout"
    assert _group_gone(int(pid_file.read_text()))


def test_async_batches_overlap_and_keep_order(pool):
    h1 = pool.submit_batch(TEXTS, GOLDS)
    h2 = pool.submit_batch(list(reversed(TEXTS)), list(reversed(GOLDS)))
    r2, r1 = h2.result(timeout=30), h1.result(timeout=30)
    assert h1.done() and h2.done()
    assert [r["total"] for r in r1] == [r["total"] for r in reversed(r2)]


def test_empty_batch(pool):
    assert pool.score_batch([], []) == []


def test_stats(pool):
    pool.score_batch(TEXTS * 10, GOLDS * 10)
    s = pool.stats()
    assert s["items"] >= 70 and s["pairs_per_s"] > 0 and s["last_batch_pairs_per_s"] > 0
    assert s["workers_alive"] == 2


def test_hostile_inputs_through_pool(pool):
    texts = [None, b"\xff\xfe", 12345, "答案：" + "9" * 10_000, "\x00" * 1000, "答案：7"]
    got = pool.score_batch(texts, ["1", None, b"1", "9", "0", 7])
    assert len(got) == 6 and all(set(r) == set(RESULT_KEYS) for r in got)
    assert got[5]["outcome"] == 1.0  # a numeric gold is compared as its text


def test_too_long_text():
    with RewardPool(n_workers=1, timeout=WALL_BOUND_S, max_text_chars=100) as p:
        got = p.score_batch(["x" * 101, "答案：1"], ["1", "1"])
    assert got[0]["error_kind"] == "too_long" and got[1]["outcome"] == 1.0


def test_inline_mode_matches():
    with RewardPool(n_workers=0, timeout=2.0) as p:
        got = p.score_batch(TEXTS, GOLDS)
        assert p.stats()["items"] == len(TEXTS)
    assert got == [score(t, g) for t, g in zip(TEXTS, GOLDS)]


def test_close_stops_workers():
    p = RewardPool(n_workers=2, timeout=WALL_BOUND_S)
    p.score_batch(TEXTS, GOLDS)
    pids = p.worker_pids()
    assert len(pids) == 2
    p.close()
    assert all(_group_gone(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        p.submit_batch(["a"], ["b"])
    p.close()  # idempotent


def test_spawn_start_method():
    with RewardPool(n_workers=1, timeout=WALL_BOUND_S, start_method="spawn") as p:
        assert p.score_batch(TEXTS[:2], GOLDS[:2])[0]["outcome"] == 1.0


@pytest.mark.parametrize("kwargs,field", [
    ({"start_method": "fork"}, "start_method"), ({"timeout": 0}, "timeout"), ({"timeout": float("inf")}, "timeout"),
    ({"n_workers": -1}, "n_workers"), ({"max_chunk": 0}, "max_chunk"), ({"cfg": {"w_outcome": 1}}, "cfg"),
    ({"timeout": 1.0, "timeout_per_item": 2.0}, "timeout_per_item"), ({"score_fn": 3}, "score_fn"),
    ({"timeout": 1.0, "cfg": RewardConfig(verify_timeout=1.0)}, "verify_timeout"),
])
def test_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RewardPool(**kwargs)


def test_mismatched_lengths():
    with RewardPool(n_workers=0) as p:
        with pytest.raises(ValueError, match="golds"):
            p.score_batch(["a", "b"], ["1"])
        with pytest.raises(ValueError, match="n_tokens"):
            p.score_batch(["a"], ["1"], n_tokens=[1, 2])


def test_timeout_per_item_alias():
    with RewardPool(n_workers=0, timeout_per_item=2.5) as p:
        assert p.timeout == 2.5


def test_workers_that_cannot_start_fail_items_instead_of_hanging(monkeypatch):
    # A score function the workers cannot import: every worker dies while starting.
    fake = types.ModuleType("only_in_parent_for_test")

    def unreachable(text, gold, cfg, n_tokens=None):
        return score(text, gold, cfg, n_tokens=n_tokens)

    unreachable.__module__, unreachable.__qualname__ = fake.__name__, "unreachable"
    fake.unreachable = unreachable
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    t0 = time.monotonic()
    with RewardPool(n_workers=2, timeout=2.0, score_fn=unreachable) as p:
        got = p.score_batch(TEXTS, GOLDS)
        assert p.stats()["no_worker"] == len(TEXTS)
    assert [r["error_kind"] for r in got] == ["no_worker"] * len(TEXTS)
    assert time.monotonic() - t0 < WALL_BOUND_S


def test_too_long_gold_and_cap_validation():
    with RewardPool(n_workers=0, timeout=5.0, max_text_chars=100) as p:
        got = p.score_batch(["答案：1", "答案：1"], ["1" * 101, "1"])
    assert got[0]["error_kind"] == "too_long" and got[1]["outcome"] == 1.0
    with pytest.raises(ValueError, match="max_text_chars"):
        RewardPool(n_workers=0, max_text_chars=0)


# The costliest texts measured for rewards.combine.score, at the pool's default cap of 1,000,000 characters.
N_CAP = 1_000_000
AT_CAP = [("步骤一：3+4=7\n" * N_CAP)[:N_CAP], ("\\boxed{" * N_CAP)[:N_CAP], "1" * N_CAP,
          ("答案：12\n" * N_CAP)[:N_CAP], ("Step 1: 2 * 3 = 6\n" * N_CAP)[:N_CAP]]


def test_items_at_the_cap_are_scored():
    with RewardPool(n_workers=2, timeout=WALL_BOUND_S) as p:
        assert RewardPool(n_workers=0).max_text_chars == N_CAP
        got = p.score_batch(AT_CAP, ["12"] * len(AT_CAP))
    assert [r["error_kind"] for r in got] == [""] * len(AT_CAP)
    assert all(r["truncated"] == 1 for r in got)


@pytest.mark.timing
def test_items_at_the_cap_cost_well_under_the_default_deadline():
    # Measured in CPU seconds of this process (what a worker spends), not wall time, so a busy machine does not
    # change the verdict: each must cost under half the default 5 s deadline (about 0.8 s on an idle core).
    assert RewardPool(n_workers=0).timeout == 5.0
    for text in AT_CAP:
        t0 = time.process_time()
        assert score(text, "12")["error_kind"] == ""
        assert time.process_time() - t0 < 2.5, text[:20]


TRAINER = r'''
import os, sys, time
sys.path[:0] = [{repo!r}, {tests!r}]
from rewards.combine import RewardConfig
from rewards.pool import RewardPool
from test_pool import hostile_score


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for tid in os.listdir("/proc/%d/task" % p):
            with open("/proc/%d/task/%s/children" % (p, tid)) as f:
                kids = [int(x) for x in f.read().split()]
            out += kids
            todo += kids
    return out


if __name__ == "__main__":
    pool = RewardPool(n_workers=2, timeout=600.0, cfg=RewardConfig(verify_timeout=0.5), score_fn=hostile_score)
    pool.score_batch(["答案：1"] * 4, ["1"] * 4)  # workers up, their sympy children started
    pool.submit_batch([{mode!r}] * 2, ["1", "1"])  # both workers now stuck in an item
    time.sleep(1.0)
    print(" ".join(map(str, descendants(os.getpid()))), flush=True)
    time.sleep(600)
'''


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, waiting to be reaped
    except OSError:
        return False


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


@pytest.mark.parametrize("mode", ["HANG", "SPIN"])
def test_workers_die_with_a_killed_trainer(tmp_path, mode):
    # SPIN holds the GIL in C code: only the kernel (the parent-death signal) can end that worker.
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.format(repo=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                     tests=os.path.dirname(os.path.abspath(__file__)), mode=mode))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        kinds = " ".join(_cmdline(p) for p in pids)
        assert "forkserver" in kinds and kinds.count("rewards._sympy_child") == 2, kinds
        assert len(pids) >= 5  # the forkserver, 2 workers, their 2 sympy children (+ the resource tracker)
        proc.kill()  # SIGKILL in the middle of the items: no clean-up code of the trainer runs
        proc.wait()
        deadline = time.monotonic() + WALL_BOUND_S  # a bound on the wait; they die within moments
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        assert [(p, _cmdline(p)[:80]) for p in pids if _alive(p)] == []
    finally:
        proc.kill()
