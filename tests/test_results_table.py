"""A short run you can judge (issue 53 item 4): the held-out table's 95 % Wilson intervals and the lift over the
initial policy with its paired standard error, against float64 NumPy computed here from the per-problem outcomes;
the words below 64 test problems; pass@k / maj@k only when k > 0 and headed with their temperature; the progress
line's KL is the one the loss used."""
import math
import re

import numpy as np
import pytest

from rl import evaluation as ev
from rl import metrics as mlib
from rl.run import progress_number, progress_values, summary_entry


def entry(solved) -> dict:
    """The summary entry of an evaluation whose greedy answers solved `solved` (0/1 per problem), through the
    code's own path (summarize -> summary_entry); no samples (k = 0)."""
    recs = [ev.ProblemSamples(bool(s), 1.0, "Answer: 1") for s in solved]
    return summary_entry(ev.summarize(recs, k=0))


def wilson_ref(x: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval in its count form:
    (x + z^2/2) / (n + z^2) +- z / (n + z^2) sqrt(x (n - x) / n + z^2 / 4)."""
    x, n, z = np.float64(x), np.float64(n), np.float64(z)
    mid = (x + z * z / 2) / (n + z * z)
    half = z / (n + z * z) * np.sqrt(x * (n - x) / n + z * z / 4)
    return float(max(mid - half, 0.0)), float(min(mid + half, 1.0))


def paired_ref(base, other) -> tuple[float, float]:
    """Mean paired difference and its standard error, by explicit sums in float64."""
    d = np.asarray(other, np.float64) - np.asarray(base, np.float64)
    n = d.size
    mean = d.sum() / n
    var = ((d - mean) ** 2).sum() / (n - 1)
    return float(mean), float(np.sqrt(var / n))


def rows_of(table: str) -> dict[str, dict[str, str]]:
    """The table's cells by row name and column header (columns are separated by two or more spaces)."""
    lines = table.splitlines()
    head = re.split(r"\s{2,}", lines[0].strip())
    out = {}
    for line in lines[2:]:
        if line.startswith("n = "):  # the words below a small table
            break
        cells = re.split(r"\s{2,}", line.strip())
        out[cells[0]] = dict(zip(head, cells))
    return out


def test_table_intervals_and_paired_lift_against_a_hand_computation():
    rng = np.random.default_rng(0)
    n = 80
    base = (rng.random(n) < 0.3).astype(int)
    after = np.where(rng.random(n) < 0.9, base, 1 - base)  # mostly the same problems: a positive correlation
    after[:12] = 1  # and a real lift
    rows = {"initial": entry(base), "grpo": entry(after)}
    assert rows["grpo"]["solved"] == "".join(map(str, after)) and rows["grpo"]["n_problems"] == n
    table = mlib.results_table(rows, k=0, temperature=0.6)
    cells = rows_of(table)
    for name, solved in (("initial", base), ("grpo", after)):
        lo, hi = wilson_ref(int(solved.sum()), n)
        assert cells[name]["95% CI"] == f"[{lo:.3f}, {hi:.3f}]"
        assert cells[name]["pass@1"] == f"{solved.mean():.3f}" and cells[name]["n"] == str(n)
    lift, se = paired_ref(base, after)
    assert cells["grpo"]["lift"] == f"{lift:+.3f}" and cells["grpo"]["lift_se (paired)"] == f"{se:.3f}"
    assert cells["initial"]["lift"] == "-"
    got = mlib.paired_lift(rows["initial"]["solved"], rows["grpo"]["solved"])
    assert got[0] == pytest.approx(lift, abs=1e-12) and got[1] == pytest.approx(se, abs=1e-12)
    # paired, not the two standard errors combined: the problems the two solve alike add no noise
    unpaired = math.hypot(rows["initial"]["pass@1_se"], rows["grpo"]["pass@1_se"])
    assert se < 0.8 * unpaired
    assert "n = " not in table and "too few" not in table  # 80 >= 64: no warning


def test_a_small_test_set_says_so_in_words():
    rows = {"initial": entry([0] * 8), "grpo": entry([1, 0, 0, 1, 0, 0, 0, 0])}
    table = mlib.results_table(rows, k=0, temperature=0.6)
    note = "\n".join(table.splitlines()[-2:])
    lo, hi = wilson_ref(4, 8)
    assert note.startswith("n = 8 test problems (< 64): too few to tell policies apart")
    assert f"{lo:.2f}-{hi:.2f}" in note and "eval.n_test" in note
    assert mlib.small_n_note(63) and not mlib.small_n_note(64)
    lift, se = paired_ref([0] * 8, [1, 0, 0, 1, 0, 0, 0, 0])
    cells = rows_of(table)["grpo"]
    assert cells["lift"] == f"{lift:+.3f}" and cells["lift_se (paired)"] == f"{se:.3f}"


def test_pass_at_k_only_when_k_is_positive_and_with_its_temperature():
    rows = {"initial": entry([0, 1] * 40), "grpo": entry([1, 1] * 40)}
    rows["grpo"].update({"pass@k": 0.125, "maj@k": 0.25})
    with_k = mlib.results_table(rows, k=2, temperature=0.7)
    cells = rows_of(with_k)["grpo"]
    assert cells["pass@2 (T 0.7)"] == "0.125" and cells["maj@2 (T 0.7)"] == "0.250"
    no_k = mlib.results_table(rows, k=0, temperature=0.7)
    assert "pass@" not in no_k.replace("pass@1", "") and "maj@" not in no_k
    # no initial row (eval.initial off), or an entry from before the per-problem outcomes were kept: no lift
    assert "lift" not in mlib.results_table({"grpo": rows["grpo"]}, k=0, temperature=0.7)
    old = {k: v for k, v in rows["grpo"].items() if k != "solved"}
    assert rows_of(mlib.results_table({"initial": rows["initial"], "grpo": old}, 0, 0.7))["grpo"]["lift"] == "-"


def test_progress_line_shows_the_kl_the_loss_used():
    """The sampled batch's `kl` is 0 while the reference drew it; the loss's KL term is `loss/kl`."""
    grpo = {"loss": 0.1, "reward/mean": 0.5, "accuracy": 0.25, "kl": 0.0, "loss/kl": 0.013, "kl/train": 0.02}
    assert progress_values(grpo, "loss") == {"loss": 0.1, "reward/mean": 0.5, "accuracy": 0.25, "loss/kl": 0.013}
    assert progress_values(grpo, "reward")["kl (reward)"] == 0.0 and "loss/kl" not in progress_values(grpo, "reward")
    no_ref = {"loss": 0.1, "reward/mean": 0.5, "loss/kl": 0.0}  # kl_coef 0: no reference, no KL shown
    assert "loss/kl" not in progress_values(no_ref, "loss")
    assert progress_values({"loss": 2.0}, None) == {"loss": 2.0}  # an SFT epoch
    # a small KL is shown, not rounded to 0.000
    assert progress_number(0.00039) == "3.90e-04" and progress_number(0.013) == "0.013" and progress_number(0.0) == "0.000"
