"""Calibration and evaluation of a process reward model on labelled splits (step logits + exact labels).

    z, y = scored_steps(logits, enc)                            # flat labelled steps, up to each first error
    calibs = fit_calibrations(z, y)                             # {"none", "temperature", "platt"}
    threshold = fit_threshold(logits, enc, calibs["platt"])     # the first-error threshold with the best F1
    res = evaluate(logits, enc, calibs, threshold)              # step metrics + first-error F1

Evaluation reads the steps of each solution up to and including its first wrong one (labels: the exact checker):
before the first error "this step is right" and "every step so far is right" are the same statement, so label
sources with either meaning (the checker's per-step labels, Math-Shepherd's "can still reach the answer") are
judged on the same ground; after the first error a solution is already wrong and ProcessBench's first-error task
ignores it too. The metrics themselves are prm/metrics.py (NumPy only).
"""
from __future__ import annotations

import numpy as np

from prm import metrics
from prm.model import Encoded

__all__ = ["scored_steps", "fit_calibrations", "fit_threshold", "evaluate"]


def scored_steps(logits: np.ndarray, enc: Encoded, upto_first_error: bool = True):
    """Flat (logits, labels) of the labelled steps, each solution's steps up to and including its first wrong one
    (all labelled steps when upto_first_error is off), and the per-solution rows (probability rows are built
    from these by the caller)."""
    z, y = [], []
    for i in range(len(enc)):
        for j in np.flatnonzero(enc.label_mask[i]):
            z.append(logits[i, j])
            y.append(enc.labels[i, j])
            if upto_first_error and enc.labels[i, j] < 0.5:
                break
    return np.asarray(z, np.float64), np.asarray(y, np.float64)


def fit_calibrations(z, y) -> dict:
    """{"none", "temperature", "platt"} calibration maps fitted on (logits, labels) of a calibration split."""
    t = metrics.fit_temperature(z, y)
    a, b = metrics.fit_platt(z, y)
    return {"none": {"kind": "none"}, "temperature": {"kind": "temperature", "a": 1.0 / t, "b": 0.0, "T": t},
            "platt": {"kind": "platt", "a": a, "b": b}}


def _rows(logits: np.ndarray, enc: Encoded, calib: dict):
    """Per solution: calibrated probabilities of its labelled steps and their labels."""
    p = metrics.calibrate(logits, calib)
    probs, labels = [], []
    for i in range(len(enc)):
        js = np.flatnonzero(enc.label_mask[i])
        probs.append([float(p[i, j]) for j in js])
        labels.append([float(enc.labels[i, j]) for j in js])
    return probs, labels


def fit_threshold(logits: np.ndarray, enc: Encoded, calib: dict) -> float:
    """The first-error threshold on calibrated probabilities maximising F1 on a (calibration) split."""
    probs, labels = _rows(logits, enc, calib)
    return metrics.best_threshold(probs, [metrics.first_error(lb) for lb in labels])


def evaluate(logits: np.ndarray, enc: Encoded, calibs: dict, threshold: float, calib_name: str = "platt") -> dict:
    """Step metrics (steps up to the first error, every calibration in `calibs`), first-error F1 at `threshold`
    (probabilities calibrated by calibs[calib_name]) and at 0.5, and the same AUROC over all labelled steps."""
    z, y = scored_steps(logits, enc)
    out = metrics.step_metrics(z, y, calibs)
    za, ya = scored_steps(logits, enc, upto_first_error=False)
    out["auroc_all_steps"] = metrics.auroc(za, ya)
    probs, labels = _rows(logits, enc, calibs[calib_name])
    true = [metrics.first_error(lb) for lb in labels]
    fe = metrics.first_error_f1([metrics.predict_first_error(p, threshold) for p in probs], true)
    fe05 = metrics.first_error_f1([metrics.predict_first_error(p, 0.5) for p in probs], true)
    out.update({f"first_error/{k}": v for k, v in fe.items()})
    out["first_error/f1@0.5"] = fe05["f1"]
    out["threshold"] = float(threshold)
    return out
