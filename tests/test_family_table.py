"""experiments/family_table.py: the per-family, per-stage table of a multi-family run over seeds."""
import json

import numpy as np

from experiments import family_table


def _run(d, vals):
    d.mkdir()
    ev = {}
    for stage, (m, c, i, lang) in vals.items():
        ev[stage] = {"pass@1/math": m, "pass@1/code": c, "pass@1/instructions": i, "language_consistency": lang,
                     "n_problems/math": 96.0, "n_problems/code": 48.0, "n_problems/instructions": 48.0}
    (d / "summary.json").write_text(json.dumps({"eval": ev}))
    return str(d)


def test_table_rows_are_stages_columns_families(tmp_path, capsys):
    a = _run(tmp_path / "s0", {"cold_start": (0.1, 0.0, 0.3, 0.9), "reasoning_rl": (0.3, 0.05, 0.2, 0.95)})
    b = _run(tmp_path / "s1", {"cold_start": (0.2, 0.0, 0.5, 1.0), "reasoning_rl": (0.4, 0.15, 0.3, 0.85)})
    assert family_table.main([a, b, "--md", str(tmp_path / "t.md")]) == 0
    text = capsys.readouterr().out
    sd = np.std([0.1, 0.2], ddof=1)
    assert f"| cold_start | 0.150 +- {sd:.3f} (0.100, 0.200) | 0.000 +- 0.000 (0.000, 0.000) |" in text
    assert "| reasoning_rl | 0.350" in text and text.index("cold_start") < text.index("reasoning_rl")
    assert "over 2 run(s)" in text and "math 96, code 48, instructions 48" in text
    assert (tmp_path / "t.md").read_text().strip() == text.strip()
    assert family_table.main([str(tmp_path / "nowhere")]) == 2


def test_gym_families_get_their_own_columns(tmp_path, capsys):
    d = tmp_path / "g0"
    d.mkdir()
    ev = {stage: {"pass@1/gym/chain_sum": a, "pass@1/gym/countdown": b, "language_consistency": 1.0,
                  "n_problems/gym/chain_sum": 64.0, "n_problems/gym/countdown": 64.0}
          for stage, (a, b) in {"cold_start": (0.25, 0.0), "grpo": (0.5, 0.125)}.items()}
    (d / "summary.json").write_text(json.dumps({"eval": ev}))
    assert family_table.main([str(d)]) == 0
    text = capsys.readouterr().out
    assert "| stage | gym/chain_sum pass@1 | gym/countdown pass@1 | language consistency |" in text
    assert "| grpo | 0.500 (0.500) | 0.125 (0.125) | 1.000 (1.000) |" in text
    assert "math pass@1" not in text and "gym/chain_sum 64, gym/countdown 64" in text
