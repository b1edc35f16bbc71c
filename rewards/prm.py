"""Process reward model (PRM): a small byte-level transformer that scores each solution step, trained on
corrupted gold solutions labelled by the exact step checker, then temperature-calibrated.

    from rewards import prm
    cfg = prm.PRMConfig()                          # defaults train in about a minute on a CPU
    model = prm.train(cfg, seed=0)                 # params + temperature + held-out metrics
    model.metrics["test_auroc"], model.metrics["test_ece_before"], model.metrics["test_ece_after"]
    prm.score_steps(model, ["Step 1: 3+4=7\\nStep 2: 7*2=15\\nAnswer: 15"])   # [[p1, p2]] calibrated P(correct)
    prm.save(model, "runs/prm.npz"); model = prm.load("runs/prm.npz")

    python -m rewards.prm --out runs/prm.npz       # train the default config, print metrics, save

Pipeline (see rewards/prm_data.py for the data):
  data         problems from rl.tasks with gold steps; train / calibration / test examples come from the
               rl.tasks "train" / "validation" / "test" splits, which never share a problem.
  model        models.transformer (all-dense, tiny) run causally over the byte tokens with return_hidden=True;
               a linear head on the final hidden state gives a logit at every token, and a step's logit is the
               one at its last byte, so it depends on the prefix up to and including the step.
               Optional auxiliary next-token loss (lm_coef) on clean solutions: the arithmetic the head must
               judge is what the language model learns to predict.
  training     AdamW with warmup + cosine decay, binary cross-entropy over labelled steps, jitted step.
  calibration  temperature scaling: p = sigmoid(logit / T), T minimising the NLL on the calibration split
               (a grid, then safeguarded Newton steps on 1/T, where the NLL is convex).
  metrics      accuracy (p >= 0.5), AUROC (rank statistic, ties averaged), ECE with 15 equal-width bins over
               p = P(correct) (sum over bins of n_b / N * |mean(y) - mean(p)|), Brier, NLL, before and after
               calibration, on the test split.

score_steps returns, for each text, one calibrated probability per step of rewards.parse.step_spans(text), after
clipping the text to `max_chars` characters; it never raises (non-text input scores as [], a failure gives []).
Plugging into the combined reward: process_rewards(model, texts, default) = mean of each text's step scores
(`default`, e.g. RewardConfig.process_default, when a text has no steps), used in place of the checker's mean step
score and weighted by RewardConfig.w_process.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from models import transformer
from models.config import ModelConfig
from rewards.parse import as_text
from rewards.prm_data import Example, build_examples, encode_windows

__all__ = ["PRMConfig", "PRM", "build_dataset", "init_params", "step_logits", "train", "score_steps", "process_rewards",
           "save",
           "load", "fit_temperature", "nll", "ece", "brier", "auroc", "evaluate"]

N_BINS = 15
_FORMAT = "mathrl-prm-v1"


@dataclass(frozen=True, kw_only=True)
class PRMConfig:
    """Everything a PRM run depends on (with the seed). Invalid values raise ValueError naming the field."""

    mix: str = "add,sub,mul,word,word_zh"  # rl.tasks mix spec; sources must have gold steps
    n_train: int = 3000  # training problems (rl.tasks "train" split)
    n_calib: int = 400  # calibration problems ("validation" split): fits the temperature
    n_test: int = 400  # test problems ("test" split): the reported metrics
    corrupt_prob: float = 0.9  # fraction of solutions with one corrupted step
    propagate_prob: float = 0.5  # of those, fraction whose wrong value is carried into later steps
    zh_fraction: float = 0.5  # Chinese step markers for language-neutral sources (arith)
    prompt_fraction: float = 0.3  # fraction of texts that start with the question prompt
    max_len: int = 64  # tokens per window (bytes + BOS); longer texts are read in overlapping windows
    d_model: int = 64  # encoder width
    n_layers: int = 2  # encoder blocks
    n_heads: int = 4  # attention heads (= key/value heads)
    d_ff: int = 128  # SwiGLU hidden width
    train_steps: int = 600  # optimizer steps
    batch_size: int = 32  # windows per step
    learning_rate: float = 3e-3  # peak AdamW learning rate
    warmup_steps: int = 30  # linear warmup, then cosine decay to 10%
    weight_decay: float = 0.01  # AdamW weight decay
    lm_coef: float = 0.5  # weight of the auxiliary next-token loss on clean solutions (0 = off)
    max_chars: int = 20_000  # score_steps clips longer texts to their first max_chars characters
    score_batch: int = 64  # windows per scoring call

    def __post_init__(self):
        if not isinstance(self.mix, str) or not self.mix.strip():
            raise ValueError(f"mix must be a non-empty rl.tasks mix spec, got {self.mix!r}")
        for name, lo in (("n_train", 1), ("n_calib", 1), ("n_test", 1), ("max_len", 8), ("d_model", 8),
                         ("n_layers", 1), ("n_heads", 1), ("d_ff", 1), ("train_steps", 0), ("batch_size", 1),
                         ("warmup_steps", 0), ("max_chars", 1), ("score_batch", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
        for name in ("corrupt_prob", "propagate_prob", "zh_fraction", "prompt_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        for name in ("learning_rate", "weight_decay", "lm_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model ({self.d_model}) must be n_heads ({self.n_heads}) times an even head width")

    def model_config(self) -> ModelConfig:
        """The encoder: an all-dense models.transformer."""
        return ModelConfig(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                           n_kv_heads=self.n_heads, head_dim=self.d_model // self.n_heads, d_ff=self.d_ff,
                           n_experts=0, moe_every=0, max_seq_len=self.max_len)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d) -> "PRMConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown PRMConfig field(s) {unknown}")
        return cls(**dict(d))


@dataclass(frozen=True)
class PRM:
    """A trained PRM: config, parameters ({"encoder": transformer params, "head": {"w", "b"}}), the
    calibration temperature and the metrics measured at training time."""

    cfg: PRMConfig
    params: Any
    temperature: float
    metrics: dict


# ---- data -----------------------------------------------------------------------------------------------------------
def build_dataset(cfg: PRMConfig, seed: int) -> dict[str, list[Example]]:
    """{"train", "calib", "test"} examples from the rl.tasks train / validation / test splits."""
    kw = dict(corrupt_prob=cfg.corrupt_prob, propagate_prob=cfg.propagate_prob, zh_fraction=cfg.zh_fraction,
              prompt_fraction=cfg.prompt_fraction)
    return {name: build_examples(cfg.mix, n, seed, split, **kw)
            for name, n, split in (("train", cfg.n_train, "train"), ("calib", cfg.n_calib, "validation"),
                                   ("test", cfg.n_test, "test"))}


def _window_targets(examples, max_len: int):
    """Windows of the examples and, per window token, the step label and a weight (1 where a step is read)."""
    w = encode_windows([e.text for e in examples], max_len)
    labels = np.zeros(w.tokens.shape, np.float32)
    weights = np.zeros(w.tokens.shape, np.float32)
    clean = np.zeros((w.tokens.shape[0],), np.float32)
    for e, wins, poss in zip(examples, w.window, w.pos):
        for label, win, pos in zip(e.labels, wins, poss):
            if label is not None:
                labels[win, pos], weights[win, pos] = label, 1.0
        for win in set(wins):
            clean[win] = float(e.kind == "clean")
    return w.tokens, w.mask, labels, weights, clean


# ---- model ----------------------------------------------------------------------------------------------------------
def init_params(cfg: PRMConfig, key) -> dict:
    """Encoder (models.transformer.init) and a zero-initialised linear head."""
    return {"encoder": transformer.init(cfg.model_config(), key),
            "head": {"w": jnp.zeros((cfg.d_model,), jnp.float32), "b": jnp.zeros((), jnp.float32)}}


def _forward(params, tokens, mask, mcfg: ModelConfig):
    logits, aux = transformer.forward(params["encoder"], tokens, mcfg, attn_mask=mask, return_hidden=True)
    h = aux["hidden"].astype(jnp.float32)
    return h @ params["head"]["w"] + params["head"]["b"], logits


def step_logits(params, tokens, mask, cfg: PRMConfig):
    """Uncalibrated PRM logit at every token [N, L]; a step's logit is the one at its last byte."""
    return _forward(params, tokens, mask, cfg.model_config())[0]


def _loss(params, batch, mcfg: ModelConfig, lm_coef: float):
    z, logits = _forward(params, batch["tokens"], batch["mask"], mcfg)
    w = batch["weights"]
    bce = jnp.sum(optax.sigmoid_binary_cross_entropy(z, batch["labels"]) * w) / jnp.maximum(jnp.sum(w), 1.0)
    # Next-token loss on clean windows: token t + 1 predicted from position t.
    lm_w = (batch["mask"][:, 1:] * batch["clean"][:, None]).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    tok_nll = -jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], axis=-1)[..., 0]
    lm = jnp.sum(tok_nll * lm_w) / jnp.maximum(jnp.sum(lm_w), 1.0)
    return bce + lm_coef * lm, {"bce": bce, "lm": lm}


def _make_optimizer(cfg: PRMConfig):
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1),
                                                  max(cfg.train_steps, cfg.warmup_steps + 1),
                                                  end_value=0.1 * cfg.learning_rate)
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, weight_decay=cfg.weight_decay))


_TRAIN_STEPS: dict = {}


def _make_train_step(cfg: PRMConfig, opt):
    """The jitted train step, cached per config (a second train() with the same config does not recompile)."""
    if cfg in _TRAIN_STEPS:
        return _TRAIN_STEPS[cfg]
    mcfg, lm_coef = cfg.model_config(), float(cfg.lm_coef)

    @jax.jit
    def step(params, opt_state, batch):
        (loss, parts), grads = jax.value_and_grad(_loss, has_aux=True)(params, batch, mcfg, lm_coef)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, dict(parts, loss=loss)

    _TRAIN_STEPS[cfg] = step
    return step


def _batches(n_windows: int, cfg: PRMConfig, rng: np.random.Generator):
    """Window indices for every step: reshuffled epochs, fixed batch size."""
    order = np.zeros((0,), np.int64)
    for _ in range(cfg.train_steps):
        if len(order) < cfg.batch_size:
            order = np.concatenate([order, rng.permutation(n_windows)])
        yield order[:cfg.batch_size]
        order = order[cfg.batch_size:]


def _trim_len(mask: np.ndarray, max_len: int) -> int:
    """A padded length that covers the batch: 32, 64, ... or max_len (few distinct shapes to compile)."""
    longest = int(mask.sum(axis=1).max()) if mask.size else 1
    n = 32
    while n < longest:
        n *= 2
    return min(n, max_len)


# ---- metrics (numpy float64) ----------------------------------------------------------------------------------------
def _sigmoid(z):
    z = np.asarray(z, np.float64)
    return np.where(z >= 0, 1.0 / (1.0 + np.exp(-np.abs(z))), np.exp(-np.abs(z)) / (1.0 + np.exp(-np.abs(z))))


def nll(logits, labels, temperature: float = 1.0) -> float:
    """Mean binary cross-entropy of sigmoid(logits / temperature) against 0/1 labels."""
    z = np.asarray(logits, np.float64) / temperature
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
    count = np.bincount(idx, minlength=n_bins)
    gap = np.abs(np.bincount(idx, y, minlength=n_bins) - np.bincount(idx, p, minlength=n_bins))
    return float(np.sum(gap) / p.size)  # |sum y - sum p| / N per bin == (n_b / N) |mean y - mean p|


def brier(probs, labels) -> float:
    p, y = np.asarray(probs, np.float64), np.asarray(labels, np.float64)
    return float(np.mean((p - y) ** 2)) if p.size else 0.0


def auroc(scores, labels) -> float:
    """Area under the ROC curve: P(score of a random positive > a random negative), ties counted as 1/2
    (Mann-Whitney U with average ranks). 0.5 when one class is missing."""
    s, y = np.asarray(scores, np.float64), np.asarray(labels, np.float64) > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), np.float64)
    sorted_s = s[order]
    # Average rank (1-based) of each run of tied scores.
    boundaries = np.flatnonzero(np.diff(sorted_s)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(s)]])
    for a, b in zip(starts, ends):
        ranks[order[a:b]] = (a + b + 1) / 2.0
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def fit_temperature(logits, labels, t_min: float = 0.05, t_max: float = 100.0) -> float:
    """Temperature T minimising nll(logits, labels, T), within [t_min, t_max].

    With a = 1 / T the NLL is convex in a (second derivative mean(z^2 s (1 - s)) >= 0), so a coarse grid
    over log T followed by Newton steps on a (kept inside the bounds, accepted only when they lower the NLL)
    finds the minimum. No data (or constant labels and zero logits) gives T = 1."""
    z = np.asarray(logits, np.float64).ravel()
    y = np.asarray(labels, np.float64).ravel()
    if z.size == 0 or not np.any(z):
        return 1.0

    def f(a):
        return float(np.mean(np.logaddexp(0.0, a * z) - y * a * z))

    a_lo, a_hi = 1.0 / t_max, 1.0 / t_min
    grid = 1.0 / np.exp(np.linspace(np.log(t_min), np.log(t_max), 81))
    a = float(min(grid, key=f))
    for _ in range(50):
        s = _sigmoid(a * z)
        g = float(np.mean(z * (s - y)))
        h = float(np.mean(z * z * s * (1.0 - s)))
        if h <= 1e-300:
            break
        new = float(np.clip(a - g / h, a_lo, a_hi))
        while f(new) > f(a) and abs(new - a) > 1e-15:
            new = 0.5 * (new + a)  # damped step: Newton can overshoot far from the minimum
        if abs(new - a) <= 1e-12 * max(a, 1.0):
            a = new
            break
        a = new
    return float(1.0 / a)


def evaluate(logits, labels, temperature: float) -> dict:
    """Accuracy, AUROC, ECE, Brier and NLL before (T = 1) and after calibration."""
    z, y = np.asarray(logits, np.float64), np.asarray(labels, np.float64)
    p0, p1 = _sigmoid(z), _sigmoid(z / temperature)
    return {"n": int(z.size), "frac_correct": float(y.mean()) if y.size else 0.0,
            "accuracy": float(np.mean((p1 >= 0.5) == (y > 0.5))) if y.size else 0.0, "auroc": auroc(z, y),
            "ece_before": ece(p0, y), "ece_after": ece(p1, y), "brier_before": brier(p0, y),
            "brier_after": brier(p1, y), "nll_before": nll(z, y), "nll_after": nll(z, y, temperature)}


# ---- scoring --------------------------------------------------------------------------------------------------------
_JIT_LOGITS: dict = {}


def _logits_fn(cfg: PRMConfig):
    if cfg not in _JIT_LOGITS:
        _JIT_LOGITS[cfg] = jax.jit(lambda p, t, m: step_logits(p, t, m, cfg))
    return _JIT_LOGITS[cfg]


def _window_logits(params, tokens: np.ndarray, mask: np.ndarray, cfg: PRMConfig) -> np.ndarray:
    """Logits [N, L] for all windows, in chunks of score_batch rows padded to a power of two (few shapes)."""
    fn, out = _logits_fn(cfg), np.zeros(tokens.shape, np.float32)
    for i in range(0, len(tokens), cfg.score_batch):
        t, m = tokens[i:i + cfg.score_batch], mask[i:i + cfg.score_batch]
        rows = 1
        while rows < len(t):
            rows *= 2
        length = _trim_len(m, cfg.max_len)
        tp = np.zeros((rows, length), np.int32)
        mp = np.zeros((rows, length), np.int32)
        tp[:len(t)], mp[:len(t)] = t[:, :length], m[:, :length]
        out[i:i + len(t), :length] = np.asarray(fn(params, tp, mp))[:len(t)]
    return out


def _raw_step_logits(params, texts, cfg: PRMConfig) -> list[np.ndarray]:
    w = encode_windows(texts, cfg.max_len)
    z = _window_logits(params, w.tokens, w.mask, cfg) if len(w.tokens) else w.tokens.astype(np.float32)
    return [z[np.asarray(wins, np.int64), np.asarray(poss, np.int64)] if wins else np.zeros((0,))
            for wins, poss in zip(w.window, w.pos)]


def score_steps(prm: PRM, texts) -> list[list[float]]:
    """Calibrated P(step is correct) for every step of every text (see the module docstring). Never raises:
    non-text items give [], a bare str / bytes counts as a batch of one, texts are clipped to prm.cfg.max_chars characters, and an internal failure on one
    text gives [] for that text."""
    if isinstance(texts, (str, bytes, bytearray)):
        texts = [texts]  # one text given bare: score it as a batch of one
    try:
        items = list(texts)
    except Exception:  # noqa: BLE001 - not iterable
        return []
    clean = [as_text(t)[:prm.cfg.max_chars] for t in items]
    try:
        raw = _raw_step_logits(prm.params, clean, prm.cfg)
    except Exception:  # noqa: BLE001 - one bad text must not take down the batch: retry one by one
        raw = []
        for t in clean:
            try:
                raw.append(_raw_step_logits(prm.params, [t], prm.cfg)[0])
            except Exception:  # noqa: BLE001
                raw.append(np.zeros((0,)))
    return [[float(p) for p in _sigmoid(z / prm.temperature)] for z in raw]


def process_rewards(prm: PRM, texts, default: float = 0.0) -> list[float]:
    """Mean calibrated step score of each text (`default` when it has no steps): the PRM's process reward, to be
    weighted by RewardConfig.w_process in place of the checker's mean step score. Never raises."""
    return [float(np.mean(row)) if row else float(default) for row in score_steps(prm, texts)]


# ---- training -------------------------------------------------------------------------------------------------------
def _labelled(examples, raw) -> tuple[np.ndarray, np.ndarray]:
    z, y = [], []
    for e, logits in zip(examples, raw):
        for label, logit in zip(e.labels, logits):
            if label is not None:
                z.append(logit)
                y.append(label)
    return np.asarray(z, np.float64), np.asarray(y, np.float64)


def train(cfg: PRMConfig, seed: int, *, data: dict | None = None, log_every: int = 0) -> PRM:
    """Build the data, train, fit the temperature on the calibration split and measure on the test split.

    metrics: test_* (accuracy, auroc, ece_before/after, brier_before/after, nll_before/after, n, frac_correct),
    calib_nll_before/after, train_loss (mean of the last 20 steps), train_seconds, n_train_steps_labelled."""
    if not isinstance(cfg, PRMConfig):
        raise TypeError(f"cfg must be a PRMConfig, got {type(cfg).__name__}")
    t0 = time.time()
    data = build_dataset(cfg, seed) if data is None else data
    tokens, mask, labels, weights, clean = _window_targets(data["train"], cfg.max_len)
    params = init_params(cfg, jax.random.key(seed))
    opt = _make_optimizer(cfg)
    opt_state = opt.init(params)
    step_fn = _make_train_step(cfg, opt)
    rng = np.random.default_rng(seed)
    losses = []
    for i, idx in enumerate(_batches(len(tokens), cfg, rng)):
        length = _trim_len(mask[idx], cfg.max_len)
        batch = {"tokens": tokens[idx, :length], "mask": mask[idx, :length], "labels": labels[idx, :length],
                 "weights": weights[idx, :length], "clean": clean[idx]}
        params, opt_state, m = step_fn(params, opt_state, batch)
        losses.append(m)
        if log_every and (i + 1) % log_every == 0:
            print(f"step {i + 1}: loss {float(m['loss']):.4f} bce {float(m['bce']):.4f} lm {float(m['lm']):.4f}",
                  flush=True)
    train_seconds = time.time() - t0
    z_cal, y_cal = _labelled(data["calib"], _raw_step_logits(params, [e.text for e in data["calib"]], cfg))
    temperature = fit_temperature(z_cal, y_cal)
    z_test, y_test = _labelled(data["test"], _raw_step_logits(params, [e.text for e in data["test"]], cfg))
    metrics = {f"test_{k}": v for k, v in evaluate(z_test, y_test, temperature).items()}
    tail = losses[-20:]
    metrics.update(calib_nll_before=nll(z_cal, y_cal), calib_nll_after=nll(z_cal, y_cal, temperature),
                   temperature=temperature, train_seconds=train_seconds, n_train_windows=int(len(tokens)),
                   n_train_steps_labelled=int(weights.sum()),
                   train_bce=float(np.mean([float(m["bce"]) for m in tail])) if tail else float("nan"))
    return PRM(cfg, jax.device_get(params), float(temperature), metrics)


# ---- save / load ----------------------------------------------------------------------------------------------------
def _flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def _unflatten(flat):
    tree: dict = {}
    for key, value in flat.items():
        node = tree
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = jnp.asarray(value)
    return tree


def save(prm: PRM, path) -> None:
    """Write the PRM to a .npz file: arrays under "params/...", config / temperature / metrics as JSON text."""
    meta = {"format": _FORMAT, "cfg": prm.cfg.to_dict(), "temperature": prm.temperature, "metrics": prm.metrics}
    arrays = {f"params/{k}": v for k, v in _flatten(jax.device_get(prm.params)).items()}
    with open(path, "wb") as fh:
        np.savez(fh, __meta__=np.array(json.dumps(meta)), **arrays)


def load(path) -> PRM:
    """Read a PRM written by save (no pickle: allow_pickle=False)."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["__meta__"]))
        if meta.get("format") != _FORMAT:
            raise ValueError(f"{path}: not a PRM file (format {meta.get('format')!r}, expected {_FORMAT!r})")
        flat = {k[len("params/"):]: z[k] for k in z.files if k.startswith("params/")}
    return PRM(PRMConfig.from_dict(meta["cfg"]), _unflatten(flat), float(meta["temperature"]), meta["metrics"])


def _main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Train the process reward model and print held-out metrics.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="save the trained PRM here (.npz)")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="PRMConfig overrides (JSON values)")
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        try:
            overrides[name] = json.loads(value)
        except json.JSONDecodeError:
            overrides[name] = value
    cfg = PRMConfig.from_dict({**PRMConfig().to_dict(), **overrides})
    model = train(cfg, args.seed, log_every=max(cfg.train_steps // 10, 1))
    print(json.dumps(model.metrics, indent=1, sort_keys=True))
    if args.out:
        save(model, args.out)
        print(f"saved {args.out}")


if __name__ == "__main__":
    _main()
