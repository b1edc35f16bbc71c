"""rl.train_loop.train_on, the one optimizer loop, as a plain function over a fake step: every row once per epoch in
near-equal minibatches, each step's learning rate at the stage's true progress (the last step of the last unit at
end_lr_fraction x lr whatever the step count), and consecutive skipped steps counted across calls up to
NonFiniteError."""
import numpy as np
import pytest

from rl.train_loop import Carry, LoopConfig, NonFiniteError, Trainer, check_trained, train_on


def _batch(rows: int = 10, cols: int = 6) -> dict:
    tokens = np.arange(rows * cols, dtype=np.int32).reshape(rows, cols)
    mask = np.ones((rows, cols), np.float32)
    return {"tokens": tokens, "attn_mask": mask, "loss_mask": mask}


def _fake(skip_calls=()):
    seen = []

    def step(state, mb, hp):
        real = np.asarray(mb["attn_mask"]).any(1)  # each minibatch is padded to max_rows (one shape) with empty rows
        seen.append({"rows": np.asarray(mb["tokens"])[real, 0], "n_real": int(real.sum()), "lr": float(hp["lr"]),
                     "kl_coef": float(hp["kl_coef"])})
        skipped = np.int32(len(seen) - 1 in skip_calls)
        return {"n": state["n"] + 1}, {"skipped": skipped, "lr": hp["lr"], "loss/total": np.float32(len(seen))}

    return step, seen


def test_every_row_once_per_epoch_and_the_schedule_follows_progress():
    step, seen = _fake()
    loop = LoopConfig(lr=1e-2, warmup_steps=0, end_lr_fraction=0.25)
    trainer = Trainer(step_fn=step, loop=loop, units=2)
    batch = _batch(10)
    carry, m = train_on(trainer, Carry(state={"n": 0}), batch, epochs=2, rng=np.random.default_rng(0), max_rows=4,
                        unit=0, kl_coef=0.5)
    assert carry.state == {"n": 6} and carry.opt_steps == 6 and m["optimizer_steps"] == 6  # 10 rows: 4 + 3 + 3, twice
    assert m["train/min_rows_per_step"] == 3 and m["train/max_rows_per_step"] == 4
    for epoch in (seen[:3], seen[3:]):
        rows = np.concatenate([s["rows"] for s in epoch])
        assert sorted(rows.tolist()) == sorted(batch["tokens"][:, 0].tolist())
        assert sorted(s["n_real"] for s in epoch) == [3, 3, 4]
    # unit 0 of 2, 6 steps: progress (j + 1) / 6 / 2; float64 reference of the linear decay
    want = [1e-2 * (1 - 0.75 * (j + 1) / 12) for j in range(6)]
    np.testing.assert_allclose([s["lr"] for s in seen], want, rtol=1e-6)
    assert all(s["kl_coef"] == 0.5 for s in seen)
    seen.clear()
    carry, m = train_on(trainer, carry, batch, epochs=1, rng=np.random.default_rng(1), max_rows=4, unit=1)
    assert carry.opt_steps == 9 and seen[-1]["lr"] == pytest.approx(0.25 * 1e-2, rel=1e-6)  # the stage's last step


def test_consecutive_skips_count_across_calls_and_stop_the_run():
    step, _ = _fake(skip_calls={2, 3, 4, 5})
    trainer = Trainer(step_fn=step, loop=LoopConfig(), units=3, max_consecutive_skips=4, name="grpo")
    carry, m = train_on(trainer, Carry(state={"n": 0}), _batch(8), epochs=1, rng=np.random.default_rng(0),
                        max_rows=4, unit=0)  # steps 0, 1 fine
    assert carry.consecutive_skips == 0 and m["skipped_steps"] == 0
    carry, m = train_on(trainer, carry, _batch(8), epochs=1, rng=np.random.default_rng(0), max_rows=4, unit=1)
    assert carry.consecutive_skips == 2 and m["skipped_steps"] == 2  # steps 2, 3 skipped
    with pytest.raises(NonFiniteError, match="stage 'grpo': 4 consecutive"):
        train_on(trainer, carry, _batch(8), epochs=1, rng=np.random.default_rng(0), max_rows=4, unit=2)


def test_a_stage_whose_every_step_was_skipped_fails_below_the_consecutive_limit():
    """model.lora.alpha 1e300 skipped every step of a tiny run, fewer than run.max_consecutive_skips, and the run
    exited 0 with a normal table: a stage that changed nothing is an error at its end; one finite step is enough."""
    step, _ = _fake(skip_calls={0, 1, 2, 3})
    trainer = Trainer(step_fn=step, loop=LoopConfig(), units=2, max_consecutive_skips=20, name="grpo")
    carry = Carry(state={"n": 0})
    check_trained("grpo", carry)  # no step yet (e.g. every group had equal rewards): the run's own warning
    for u in range(2):
        carry, _ = train_on(trainer, carry, _batch(8), epochs=1, rng=np.random.default_rng(0), max_rows=4, unit=u)
    with pytest.raises(NonFiniteError, match="stage 'grpo': every one of its 4 optimizer steps was skipped"):
        check_trained("grpo", carry)
    step, _ = _fake(skip_calls={1, 2, 3})
    carry, _ = train_on(trainer._replace(step_fn=step), Carry(state={"n": 0}), _batch(16), epochs=1,
                        rng=np.random.default_rng(0), max_rows=4, unit=0)
    check_trained("grpo", carry)  # step 0 was finite
