"""The process reward model's metrics and calibration: pure NumPy (float64) functions on plain arrays and lists.

    auroc(scores, labels)                      rank statistic, ties counted 1/2 (Mann-Whitney U)
    ece(probs, labels)                         15 equal-width bins over p = P(good)
    nll / brier                                mean binary cross-entropy / squared error
    fit_temperature(logits, labels)            T of p = sigmoid(z / T), minimising the NLL
    fit_platt(logits, labels)                  (a, b) of p = sigmoid(a z + b), minimising the NLL
    step_metrics(logits, labels, calib)        AUROC, ECE / Brier / NLL before and after both calibrations
    first_error(labels) / predict_first_error(probs, threshold)
    first_error_f1(pred, true)                 ProcessBench: harmonic mean of the accuracy on erroneous solutions
                                               (exact index of the first wrong step) and on correct ones ("none")
    best_threshold(probs_per_solution, true)   the threshold maximising first-error F1 (fitted on a split)
    best_of_n(...)                             selection accuracy of a solution scorer vs majority vote vs oracle

Conventions: a label is 1.0 for a good step and 0.0 for a wrong one; `first_error` returns -1 when every step is
good (ProcessBench's "all correct"). Calibration parameters are fitted on a calibration split and applied to the
test split. Everything here is deterministic and has no JAX dependency (tests check it against hand-computed
values and independent references). AGGREGATES, the names aggregate() implements, are declared here and checked by
the PRM section (prm/config.py: prm.agg); the calibration maps' names come from rewards.combine (PRM_CALIBRATIONS),
below the wing, where a stage's prm_calibration field checks them.
"""
from __future__ import annotations

import math

import numpy as np

# The maps' names are declared below the wing (rewards/combine.py): a stage's prm_calibration (rl/) checks them.
from rewards.combine import PRM_CALIBRATIONS as CALIBRATIONS

__all__ = ["N_BINS", "sigmoid", "nll", "ece", "brier", "auroc", "fit_temperature", "fit_platt", "calibrate",
           "step_metrics", "first_error", "predict_first_error", "first_error_f1", "best_threshold", "aggregate",
           "AGGREGATES", "CALIBRATIONS", "best_of_n"]

N_BINS = 15
AGGREGATES = ("min", "mean", "prod", "last")  # a solution's score from its step scores (aggregate; prm.agg)


def sigmoid(z):
    """Numerically stable logistic function, float64."""
    z = np.asarray(z, np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def nll(logits, labels, a: float = 1.0, b: float = 0.0) -> float:
    """Mean binary cross-entropy of sigmoid(a * logits + b) against labels in [0, 1]."""
    z = a * np.asarray(logits, np.float64) + b
    y = np.asarray(labels, np.float64)
    return float(np.mean(np.logaddexp(0.0, z) - y * z)) if z.size else 0.0


def ece(probs, labels, n_bins: int = N_BINS) -> float:
    """Expected calibration error of p = P(label = 1): bins [k/n, (k+1)/n) (the last one includes 1),
    sum over bins of (bin size / N) * |mean(label) - mean(p)|."""
    p = np.asarray(probs, np.float64)
    y = np.asarray(labels, np.float64)
    if p.size == 0:
        return 0.0
    idx = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)
    gap = np.abs(np.bincount(idx, y, minlength=n_bins) - np.bincount(idx, p, minlength=n_bins))
    return float(np.sum(gap) / p.size)  # |sum y - sum p| / N per bin == (n_b / N) |mean y - mean p|


def brier(probs, labels) -> float:
    p, y = np.asarray(probs, np.float64), np.asarray(labels, np.float64)
    return float(np.mean((p - y) ** 2)) if p.size else 0.0


def auroc(scores, labels) -> float:
    """P(score of a random positive > score of a random negative), ties counted as 1/2 (Mann-Whitney U with
    average ranks). 0.5 when one class is missing."""
    s, y = np.asarray(scores, np.float64), np.asarray(labels, np.float64) > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(sorted_s)) + 1])
    ends = np.concatenate([starts[1:], [len(s)]])
    ranks = np.empty(len(s), np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # average 1-based rank of each tie run
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _newton_nll(z, y, a, b, fit_bias: bool, iters: int = 100):
    """Damped Newton on the NLL of sigmoid(a z + b) (convex in (a, b)); b stays fixed unless fit_bias."""
    def f(a_, b_):
        return nll(z, y, a_, b_)

    for _ in range(iters):
        p = sigmoid(a * z + b)
        r, w = p - y, p * (1.0 - p)
        g = np.array([np.mean(r * z), np.mean(r)]) if fit_bias else np.array([np.mean(r * z)])
        h = (np.array([[np.mean(w * z * z), np.mean(w * z)], [np.mean(w * z), np.mean(w)]]) if fit_bias
             else np.array([[np.mean(w * z * z)]]))
        h = h + 1e-12 * np.eye(len(g))
        step = np.linalg.solve(h, g)
        t, cur = 1.0, f(a, b)
        while True:  # backtracking: far from the minimum a full Newton step can overshoot
            na, nb = a - t * step[0], (b - t * step[1]) if fit_bias else b
            if f(na, nb) <= cur or t < 1e-10:
                break
            t *= 0.5
        if abs(na - a) + abs(nb - b) <= 1e-12 * (1.0 + abs(a) + abs(b)):
            return na, nb
        a, b = na, nb
    return a, b


def fit_temperature(logits, labels, t_min: float = 0.05, t_max: float = 100.0) -> float:
    """Temperature T minimising nll(logits / T, labels), within [t_min, t_max]. The NLL is convex in 1 / T, so a
    coarse grid over log T then damped Newton steps on 1 / T find the minimum. No data or all-zero logits: 1."""
    z = np.asarray(logits, np.float64).ravel()
    y = np.asarray(labels, np.float64).ravel()
    if z.size == 0 or not np.any(z):
        return 1.0
    grid = 1.0 / np.exp(np.linspace(np.log(t_min), np.log(t_max), 81))
    a0 = float(min(grid, key=lambda a: nll(z, y, a)))
    a, _ = _newton_nll(z, y, a0, 0.0, fit_bias=False)
    return float(1.0 / np.clip(a, 1.0 / t_max, 1.0 / t_min))


def fit_platt(logits, labels) -> tuple[float, float]:
    """Platt scaling: (a, b) minimising nll(a * logits + b, labels) (logistic regression on the logit). Starts from
    the fitted temperature and a zero bias; no data gives (1, 0)."""
    z = np.asarray(logits, np.float64).ravel()
    y = np.asarray(labels, np.float64).ravel()
    if z.size == 0:
        return 1.0, 0.0
    a, b = _newton_nll(z, y, 1.0 / fit_temperature(z, y), 0.0, fit_bias=True)
    return float(a), float(b)


def _affine(calib: dict) -> tuple[float, float]:
    if calib.get("kind", "none") == "none":
        return 1.0, 0.0
    return float(calib["a"]), float(calib.get("b", 0.0))


def calibrate(logits, calib: dict) -> np.ndarray:
    """Calibrated probabilities: calib = {"kind": "none" | "temperature" | "platt", "a", "b"} (p = sigmoid(a z + b);
    temperature scaling is a = 1 / T, b = 0; "none" is sigmoid(z))."""
    a, b = _affine(calib)
    return sigmoid(a * np.asarray(logits, np.float64) + b)


def step_metrics(logits, labels, calibs: dict) -> dict:
    """AUROC (calibration never changes it: both maps are increasing) and, per calibration in `calibs`
    ({"none": {...}, "temperature": {...}, "platt": {...}}), ECE, Brier and NLL; plus n and the good-step share."""
    z, y = np.asarray(logits, np.float64), np.asarray(labels, np.float64)
    out = {"n": int(z.size), "frac_good": float(y.mean()) if y.size else 0.0, "auroc": auroc(z, y)}
    for name, c in calibs.items():
        a, b = _affine(c)
        p = sigmoid(a * z + b)
        out[f"ece/{name}"] = ece(p, y)
        out[f"brier/{name}"] = brier(p, y)
        out[f"nll/{name}"] = nll(z, y, a, b)
    return out


# ---- first error (ProcessBench) -------------------------------------------------------------------------------------
def first_error(labels) -> int:
    """Index of the first wrong step (label < 0.5) among a solution's labels, -1 when all are good. None entries
    (steps nobody could judge) are skipped but keep their index."""
    for i, y in enumerate(labels):
        if y is not None and float(y) < 0.5:
            return i
    return -1


def predict_first_error(probs, threshold: float = 0.5) -> int:
    """The first step whose score is below `threshold`, -1 ("all correct") when none is."""
    for i, p in enumerate(probs):
        if p is not None and float(p) < threshold:
            return i
    return -1


def first_error_f1(pred, true) -> dict:
    """ProcessBench's score: acc_error = share of erroneous solutions (true >= 0) whose predicted first-error index
    is exactly right, acc_correct = share of correct ones (true == -1) predicted -1, f1 = their harmonic mean
    (0 when either is 0; a missing subset gives f1 = the other accuracy)."""
    pred, true = np.asarray(pred, np.int64), np.asarray(true, np.int64)
    err, ok = true >= 0, true < 0
    acc_e = float(np.mean(pred[err] == true[err])) if err.any() else float("nan")
    acc_c = float(np.mean(pred[ok] == -1)) if ok.any() else float("nan")
    if math.isnan(acc_e) or math.isnan(acc_c):
        f1 = acc_c if math.isnan(acc_e) else acc_e
        f1 = 0.0 if math.isnan(f1) else f1
    else:
        f1 = 0.0 if acc_e + acc_c == 0 else 2 * acc_e * acc_c / (acc_e + acc_c)
    return {"f1": float(f1), "acc_error": acc_e, "acc_correct": acc_c, "n_error": int(err.sum()),
            "n_correct": int(ok.sum())}


def best_threshold(probs_per_solution, true) -> float:
    """The threshold in (0, 1) maximising first_error_f1 of predict_first_error (ties: the one closest to 0.5).
    Candidates are the midpoints between distinct observed scores, plus 0.5."""
    scores = np.unique(np.concatenate([np.asarray([p for p in row if p is not None], np.float64)
                                       for row in probs_per_solution] + [np.array([0.0, 1.0])]))
    cands = np.unique(np.concatenate([(scores[1:] + scores[:-1]) / 2.0, [0.5]]))
    if len(cands) > 400:  # quantiles of the candidates: enough resolution, bounded cost
        cands = np.unique(np.concatenate([np.quantile(cands, np.linspace(0, 1, 399)), [0.5]]))
    best, best_f1 = 0.5, -1.0
    for t in cands:
        f1 = first_error_f1([predict_first_error(r, t) for r in probs_per_solution], true)["f1"]
        if f1 > best_f1 + 1e-12 or (abs(f1 - best_f1) <= 1e-12 and abs(t - 0.5) < abs(best - 0.5)):
            best, best_f1 = float(t), f1
    return best


# ---- solution scores and best-of-N ----------------------------------------------------------------------------------
def aggregate(probs, how: str = "min", default: float = 0.0) -> float:
    """One score per solution from its step probabilities: min (the weakest step, Math-Shepherd / Lightman et al.),
    mean, prod (all steps good, if independent) or last; `default` for a solution without scored steps."""
    p = np.asarray([x for x in probs if x is not None], np.float64)
    if p.size == 0:
        return float(default)
    if how == "min":
        return float(p.min())
    if how == "mean":
        return float(p.mean())
    if how == "prod":
        return float(np.prod(p))
    if how == "last":
        return float(p[-1])
    raise ValueError(f"aggregate how must be one of {AGGREGATES}, got {how!r}")


def best_of_n(scores, correct, clusters, ns) -> dict:
    """Selection accuracy of choosing one of N samples, per N in `ns`, for each problem's samples split into
    len // N disjoint groups of N (every sample used once; the mean over groups and problems):

        prm       the sample with the highest score is correct (ties: the first)
        majority  the first sample of the largest answer cluster is correct (no answer never wins; ties: the cluster
                  seen first, as rl.evaluation.majority_answer)
        oracle    some sample of the group is correct (pass@N, the ceiling of any selector)

    scores / correct / clusters: one list per problem (cluster ids from rl.evaluation.answer_clusters, None for
    no answer). Returns {N: {"prm", "majority", "oracle", "groups"}}."""
    out = {}
    for n in ns:
        hits = {"prm": [], "majority": [], "oracle": []}
        for s, c, k in zip(scores, correct, clusters):
            for g in range(len(s) // n):
                sl = slice(g * n, (g + 1) * n)
                gs, gc, gk = list(s[sl]), list(c[sl]), list(k[sl])
                hits["prm"].append(bool(gc[int(np.argmax(gs))]))
                hits["oracle"].append(any(gc))
                counts: dict = {}
                for x in gk:
                    if x is not None:
                        counts[x] = counts.get(x, 0) + 1
                if counts:
                    top = max(counts.values())
                    hits["majority"].append(bool(gc[next(i for i, x in enumerate(gk) if x is not None
                                                         and counts[x] == top)]))
                else:
                    hits["majority"].append(False)
        out[n] = {k: float(np.mean(v)) if v else float("nan") for k, v in hits.items()}
        out[n]["groups"] = len(hits["prm"])
    return out
