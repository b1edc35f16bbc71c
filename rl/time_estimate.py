"""How long a run will take, phase by phase, before it starts: FLOPs and bytes at this machine's measured speed.

    est = time_estimate.estimate(cfg, model_cfg, calibration.load())
    print(time_estimate.text(est))       # the dry run and the run's start print this next to the memory plan
    est["total_s"], est["compile_s"], est["eval_s"], est["stages"][i]["unit_s"]

Each phase is a sum of a few terms from rl/calibration.py's figures, times a factor this project measured (below):
- sampling: the answers decode through `sampling.batch_rows` slots (continuous batching: a finished row's slot takes
  the next row), `EXPECTED_LENGTH` of max_new_tokens on average (the shipped recipes' answers: SmolLM2's mean length
  98 -> 47 of 128 tokens over a run, the toy's ~0.6); a decode step costs its FLOPs at the matmul rate of its rows,
  its bytes (every weight and the KV cache) at the memory bandwidth, and a fixed cost per kernel
  (KERNELS_PER_LAYER x layers, at the calibration's loop_op_s). Prefill: the prompts' forward.
- logprobs: the KL reference's forward over the padded batch (when the stage has one) and the sampler / trainer
  check over one minibatch (PPO: the old logprobs and values over the batch), at the matmul rate of their tokens.
- the update: models.flops.train_flops over the padded batch x epochs (LoRA's cheaper backward included), on
  EXPECTED_KEPT of the groups when groups without reward variance are dropped (filter_zero_variance "drop"); with
  "refill" a full batch, after ceil(1 / EXPECTED_KEPT) draws (at most 1 + max_refill_rounds) of sampling and logprobs.
- an evaluation: (n_val + n_test) x (1 + k) answers through the same sampler.
- compiling: `compile_s` of the calibration's reference program x COMPILE_UNITS per program family the run builds
  (sampler, train step, logprob pass, evaluation); a second launch reads them from the compilation cache
  (WARM_COMPILE_SHARE of that).
- per unit: UNIT_OVERHEAD_S (host work: batching, rewards, metrics, a checkpoint).
A stage's unit is priced by its kind (rl.stages.Kind.seconds, over a Price of the run's passes): the kinds know their
work, this module the machine's speed.

The factors are from measurements in this project (docs/training.md "How long will it take?" shows the estimate
against real runs; tests/test_time_estimate.py holds a tiny run to within 2x): they are the ratio of what the
programs really take to the roofline terms above, whatever the machine. An estimate, not a promise: a loaded
machine, answers longer than EXPECTED_LENGTH or a slower disk move it.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from models import flops
from rl import calibration
from rl import config_validation as cv
from rl import stages as stage_lib

EXPECTED_LENGTH = 0.6  # mean answer length / max_new_tokens on the shipped recipes (module docstring)
KERNELS_PER_LAYER = 40  # fixed-cost kernels of one block's decode step (norms, projections, rotary, cache update, ...)
DECODE_FACTOR = 1.0  # measured decode time / its roofline terms (SmolLM2 rollouts at 64 slots: ~1x)
FORWARD_FACTOR = 1.2  # measured logprob pass / its FLOPs at the matmul rate (SmolLM2 reference pass: ~1.1-1.2x)
TRAIN_FACTOR = 1.6  # measured update / its FLOPs at the matmul rate (SmolLM2 LoRA update: ~1.6x, system CPU incl.)
EXPECTED_KEPT = 0.6  # groups with reward variance that train (filter_zero_variance; SmolLM2: 0.12-0.88 per iteration)
COMPILE_UNITS = 25.0  # a program family's compile time in reference-program compiles
WARM_COMPILE_SHARE = 0.55  # reading a run's programs back from the compilation cache vs compiling them
UNIT_OVERHEAD_S = 0.25  # host work per unit (batching, rewards, metrics, a checkpoint): the tiny quickstart 0.15-0.45 s


def _itemsize(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


def decode_s(m, cal: dict, *, rows: int, prompts: int, prompt_len: int, new_tokens: int, slots: int,
             dtype: str) -> float:
    """Seconds to draw `rows` answers of ~EXPECTED_LENGTH x new_tokens tokens for `prompts` prompts of prompt_len."""
    if rows <= 0:
        return 0.0
    length = max(1.0, EXPECTED_LENGTH * new_tokens)
    active = min(slots, rows)
    steps = max(length, rows * length / slots)  # slots refill as rows finish: total tokens / slots, at least one row
    ctx = prompt_len + length / 2  # keys a decode step's query sees on average
    step_flops = flops.forward_flops(m, active, pairs=active * ctx)  # one token per slot, its logits row included
    weights = (flops.body_weights(m) + flops.head_weights(m)) * _itemsize(dtype)  # read once per step
    kv = active * (prompt_len + new_tokens) * m.n_layers * 2 * m.n_kv_heads * m.head_dim * _itemsize(dtype)
    step_s = (step_flops / calibration.matmul_rate(cal, active) + (weights + kv) / (cal["bandwidth_gbs"] * 1e9)
              + KERNELS_PER_LAYER * m.n_layers * cal["loop_op_s"])
    prefill = forward_s(m, cal, tokens=prompts * prompt_len, seq_len=prompt_len)
    return DECODE_FACTOR * steps * step_s + prefill


def forward_s(m, cal: dict, *, tokens: float, seq_len: float) -> float:
    """Seconds of one forward (logits at every position) over `tokens` padded tokens in rows of seq_len."""
    f = flops.forward_flops(m, tokens, pairs=tokens * (seq_len + 1) / 2)
    return FORWARD_FACTOR * f / calibration.matmul_rate(cal, tokens)


def train_s(m, cal: dict, tokens: float, seq_len: float, step_tokens: float) -> float:
    """Seconds of forward + backward over `tokens` padded tokens in rows of seq_len, steps of (at most) step_tokens."""
    f = flops.train_flops(m, tokens, pairs=tokens * (seq_len + 1) / 2)
    return TRAIN_FACTOR * f / calibration.matmul_rate(cal, min(tokens, step_tokens))


class Price(NamedTuple):
    """Seconds of the passes a stage's unit makes, on one run's model and lengths at one calibration: what each kind's
    `seconds` (rl.stages.Kind) prices its unit's work with. Rows are prompt + answer (tasks.max_prompt_len +
    sampling.max_new_tokens) long; a decode's dtype "" is sampling.dtype, else model.dtype."""

    decode: Callable  # (rows, prompts, dtype="") -> seconds to sample `rows` answers to `prompts` prompts
    forward: Callable  # tokens -> seconds of a logprob pass over `tokens` padded tokens
    train: Callable  # (tokens, step_tokens) -> seconds of forward + backward over them, steps of at most step_tokens
    kept_share: float  # EXPECTED_KEPT: the share of a batch's groups with reward variance


def price(cfg, m, cal: dict) -> Price:
    """The Price of a typed config's units on model `m` at calibration `cal`."""
    P, N = cfg.tasks.max_prompt_len, cfg.sampling.max_new_tokens
    smp, seq = cfg.sampling, P + N

    def decode(rows, prompts, dtype: str = "") -> float:
        """decode_s at the run's lengths and slots, in `dtype` ("": the sampler's)."""
        return decode_s(m, cal, rows=rows, prompts=prompts, prompt_len=P, new_tokens=N, slots=smp.batch_rows,
                        dtype=dtype or smp.dtype or m.dtype)

    return Price(decode=decode, forward=lambda tokens: forward_s(m, cal, tokens=tokens, seq_len=seq),
                 train=lambda tokens, step_tokens: train_s(m, cal, tokens, seq, step_tokens), kept_share=EXPECTED_KEPT)


def _stage(s, cfg, m, cal: dict) -> dict:
    """Seconds per unit of one stage, by part: its kind's (rl.stages.Kind.seconds) and the host's."""
    parts = stage_lib.KINDS[s.kind].seconds(s, cfg, price(cfg, m, cal))
    parts["host"] = UNIT_OVERHEAD_S
    return parts


def evaluations(cfg: cv.RunConfig) -> list[tuple[int, int]]:
    """(answers, problems) of each evaluation a run makes: the initial policy's (validation + test, with
    eval.initial), each stage's end (validation + test), the mid-stage validations (every eval.every units) and the
    best policy's test evaluation at the end (checkpoint.keep_best); each problem a greedy answer + eval.k samples.
    rl.preflight.compute_estimate counts answers from it too."""
    e = cfg.eval
    full, val, test = e.n_val + e.n_test, e.n_val, e.n_test
    mids = sum((s.units - 1) // e.every if e.every else 0 for s in cfg.stages)
    probs = [full] * int(e.initial) + [full] * len(cfg.stages) + [val] * mids + [test] * int(cfg.checkpoint.keep_best)
    return [(p * (1 + e.k), p) for p in probs]


def estimate(cfg: cv.RunConfig, model_cfg, cal: dict) -> dict:
    """Seconds per phase of a validated config on the run's model (rl.setup.build_model_cfg), at `cal`
    (rl.calibration.load()): {"stages": [{"name", "kind", "units", "parts": {part: s per unit}, "unit_s",
    "stage_s"}], "eval_s" (one evaluation of validation + test), "n_evals", "evals_s" (all of them: evaluations),
    "compile_s" (cold), "compile_warm_s", "total_s" (cold),
    "total_warm_s"}."""
    e = cfg.eval
    m = model_cfg
    stages = []
    for s in cfg.stages:
        parts = _stage(s, cfg, m, cal)
        unit = sum(parts.values())
        stages.append({"name": s.stage.name, "kind": s.kind, "units": s.units, "parts": parts, "unit_s": unit,
                       "stage_s": unit * s.units})

    def eval_seconds(answers: int, problems: int) -> float:
        return decode_s(m, cal, rows=answers, prompts=problems, prompt_len=cfg.tasks.max_prompt_len,
                        new_tokens=cfg.sampling.max_new_tokens, slots=cfg.sampling.batch_rows,
                        dtype=cfg.sampling.dtype or m.dtype)

    evals = evaluations(cfg)
    full = e.n_val + e.n_test
    eval_s = eval_seconds(full * (1 + e.k), full)  # one evaluation of validation + test
    evals_s = sum(eval_seconds(a, p) for a, p in evals)
    families = 1 + len({s.kind for s in cfg.stages}) + (1 if any(stage_lib.KINDS[s.kind].is_rl for s in cfg.stages)
                                                        else 0)
    compile_s = cal["compile_s"] * COMPILE_UNITS * families * _size_factor(m)
    work = sum(st["stage_s"] for st in stages) + evals_s
    return {"stages": stages, "eval_s": eval_s, "n_evals": len(evals), "evals_s": evals_s, "compile_s": compile_s,
            "compile_warm_s": WARM_COMPILE_SHARE * compile_s, "total_s": work + compile_s,
            "total_warm_s": work + WARM_COMPILE_SHARE * compile_s}


def _size_factor(m) -> float:
    """Compile work grows with the distinct layer groups a program unrolls or scans (scanned: one body per group)
    and, slowly, with the widths."""
    groups = 1 if getattr(m, "scan_layers", False) else m.n_layers
    return math.sqrt(groups) * (1.0 + math.log2(max(m.d_model, 64) / 64) / 4)


def parallel_wall(ests: list[dict], n_par: int, cores: int) -> float:
    """Wall seconds of runs launched `n_par` at a time on `cores` cores. Their compute (sampling, logprobs, the
    update, evaluations) already fills every core of the machine, so it adds up whatever n_par; compiling and host
    work run on one core each and overlap up to min(n_par, cores) at once; never shorter than the longest run."""
    if not ests:
        return 0.0
    serial = sum(e["compile_s"] + sum(st["parts"]["host"] * st["units"] for st in e["stages"]) for e in ests)
    compute = sum(e["total_s"] for e in ests) - serial
    return max(max(e["total_s"] for e in ests), compute + serial / max(1, min(n_par, cores)))


def fmt_s(x: float) -> str:
    if x < 90:
        return f"{x:.0f} s" if x >= 10 else f"{x:.1f} s"
    if x < 5400:
        return f"{x / 60:.1f} min"
    return f"{x / 3600:.1f} h"


def text(est: dict, cal: dict | None = None) -> str:
    """The estimate as the dry run prints it."""
    lines = ["time estimate (this machine's measured speed; answers at "
             f"{EXPECTED_LENGTH:.0%} of max_new_tokens on average):"]
    for st in est["stages"]:
        parts = ", ".join(f"{k} {fmt_s(v)}" for k, v in st["parts"].items())
        lines.append(f"  {st['name']:<16}{st['units']:>5} units x {fmt_s(st['unit_s']):>8} = {fmt_s(st['stage_s']):>8}"
                     f"   (per unit: {parts})")
    lines.append(f"  evaluations     {est['n_evals']:>5} x <= {fmt_s(est['eval_s']):>5} = {fmt_s(est['evals_s']):>8}")
    lines.append(f"  compiling       {fmt_s(est['compile_s'])} cold, ~{fmt_s(est['compile_warm_s'])} from the "
                 "compilation cache")
    lines.append(f"  total ~{fmt_s(est['total_s'])} (~{fmt_s(est['total_warm_s'])} with the programs cached)"
                 + (f"; calibration: matmul {max(cal['matmul_gflops'].values()):.0f} GFLOP/s, memory "
                    f"{cal['bandwidth_gbs']:.0f} GB/s" if cal else ""))
    return "\n".join(lines)
