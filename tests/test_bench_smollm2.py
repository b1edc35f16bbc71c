"""experiments/bench/smollm2_sampler.py's interleaving of our calls with a serving peer, against a fake peer script
(the real one needs torch + transformers): calls alternate side by side, timings come back per side, and a peer
that dies is dropped with its error while our side goes on."""
import sys

import numpy as np

from experiments.bench import smollm2_sampler as bench

FAKE_PEER = """
import sys
log, die_after = sys.argv[1], int(sys.argv[2])
print("READY " + '{"system": "fake peer", "load_s": 0.25}', flush=True)
for i, line in enumerate(sys.stdin):
    if i == die_after:
        sys.exit(3)
    open(log, "a").write(f"peer {int(line)}\\n")
    print("chatter", flush=True)
    print(f"TIME {0.5 if int(line) == 1 else 2.0}", flush=True)
"""


def _start(tmp_path, die_after):
    """start_peer on the fake script (its --gguf ... arguments replaced by the log path and when to die)."""
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE_PEER)
    log = tmp_path / "calls.log"
    wrapper = tmp_path / "peer_python"  # an executable that runs the fake with our arguments, whatever it is given
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {script} {log} {die_after}\n")
    wrapper.chmod(0o755)
    ids = np.ones((2, 3), np.int32)
    proc, ready = bench.start_peer(str(wrapper), "m.gguf", ids, ids, 0, 4, script=str(script))
    return proc, ready, log


def _ours(log):
    def call(n):
        with open(log, "a") as f:
            f.write(f"ours {n}\n")
        return 0.1 * n
    return call


def test_calls_alternate_between_the_sides(tmp_path):
    proc, ready, log = _start(tmp_path, die_after=-1)
    assert ready == {"system": "fake peer", "load_s": 0.25}
    times, load, errors = bench.measure_interleaved({"ours": _ours(log), "peer": bench.peer_call(proc)}, 4, reps=2)
    proc.stdin.close()
    assert proc.wait() == 0 and errors == {} and len(load) == 2
    assert times["ours"] == ([0.1, 0.1], [0.4, 0.4]) and times["peer"] == ([0.5, 0.5], [2.0, 2.0])
    # warm-up (each side's 1 and 4), then per repetition: ours 1, peer 1, ours 4, peer 4
    assert log.read_text().split("\n")[:-1] == (["ours 1", "ours 4", "peer 1", "peer 4"]
                                                + ["ours 1", "peer 1", "ours 4", "peer 4"] * 2)
    summary = bench.summarize("fake", np.ones((2, 3)), np.ones((2, 3)), 4, *times["peer"])
    assert summary["decode_tok_per_s"] == 2 * 3 / (2.0 - 0.5) and summary["prefill_tok_per_s"] == 6 / 0.5


def test_a_peer_that_dies_is_dropped_and_ours_goes_on(tmp_path):
    proc, _, log = _start(tmp_path, die_after=3)  # answers the warm-up and one timed call, then exits 3
    times, _, errors = bench.measure_interleaved({"ours": _ours(log), "peer": bench.peer_call(proc)}, 4, reps=2)
    assert "peer" not in times and "exited 3" in errors["peer"]
    assert times["ours"] == ([0.1, 0.1], [0.4, 0.4])


def test_a_peer_that_cannot_start_reports_why(tmp_path):
    wrapper = tmp_path / "peer_python"
    wrapper.write_text("#!/bin/sh\necho 'no torch here' >&2\nexit 1\n")
    wrapper.chmod(0o755)
    proc, ready = bench.start_peer(str(wrapper), "m.gguf", np.ones((1, 1)), np.ones((1, 1)), 0, 2)
    assert proc is None and "exited 1" in ready["error"] and "no torch here" in ready["error"]
    assert "not one" in bench.start_peer(str(wrapper), "folder", np.ones((1, 1)), np.ones((1, 1)), 0, 2)[1]["error"]
