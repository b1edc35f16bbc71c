"""Executes every notebook under notebooks/ top to bottom: a notebook that raises fails the test, and each one must
show its figures inline, save them under NOTEBOOK_OUT and end with a markdown cell stating what they show.

The claim notebooks (claims_*.ipynb) read sweep results from CLAIMS_DIR: the default run gives them a hand-made
claims directory (tests/fake_claims.py), the slow run the tiny variants' real sweeps (2 seeds each)."""
import os
import pathlib
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
CLAIM_NOTEBOOKS = [p for p in NOTEBOOKS if p.name.startswith("claims_")]
ROOT = pathlib.Path(__file__).parent.parent


def _execute(path, out, monkeypatch, claims_dir=None):
    monkeypatch.setenv("NOTEBOOK_OUT", str(out))  # the kernel inherits it: figures land here, not in the tree
    if claims_dir is not None:
        monkeypatch.setenv("CLAIMS_DIR", str(claims_dir))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any(o.get("text", "").strip().endswith("ok") for o in outputs)
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure displayed inline"
    saved = list(pathlib.Path(out).rglob("*.png"))
    assert saved and all(p.stat().st_size > 10_000 for p in saved), "figures not saved under NOTEBOOK_OUT"
    last = nb.cells[-1]
    assert last.cell_type == "markdown" and "shows" in last.source and len(last.source) > 300, "no closing conclusion"
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_shows_and_concludes(path, tmp_path, monkeypatch):
    fake = None
    if path in CLAIM_NOTEBOOKS:
        from fake_claims import write_claims_dir

        fake = write_claims_dir(tmp_path / "claims")
    nb = _execute(path, tmp_path / "out", monkeypatch, fake)
    if fake is not None:  # every claim section found its arms
        text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
        assert text.count(": not run") == 0, text


@pytest.mark.parametrize("path", CLAIM_NOTEBOOKS, ids=lambda p: p.name)
def test_claim_notebook_in_a_fresh_clone_says_no_runs_and_checks_nothing(path, tmp_path, monkeypatch):
    """No claim sweeps (a fresh clone): the notebook runs to its end, says where the runs would come from, and
    neither draws nor prints "ok" over empty data."""
    monkeypatch.setenv("NOTEBOOK_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("CLAIMS_DIR", str(tmp_path / "claims"))  # does not exist
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert f"no runs found in {tmp_path / 'claims'}: see REPRODUCING.md" in text
    assert not any(o.get("text", "").strip().endswith("ok") for o in outputs), text
    assert not any("image/png" in o.get("data", {}) for o in outputs) and "not run" not in text


SHARED = ["--init_from", "{root}/process_reward/_shared/seed{seed}"]  # one cold start per seed, as REPRODUCING.md does
TINY_SWEEPS = [  # (config, workdir, extra sweep args): at least two arms of one claim per notebook
    ("claim_process_reward.py:variant=tiny", "process_reward", ["--only", "process_weight=0.0", "--only", "process_weight=0.2"]),
    ("claim_cold_start.py:arm=zero,variant=tiny", "cold_start_zero", ["--init_from", "none"]),
    ("claim_rejection.py:arm=both,variant=tiny", "rejection_both", SHARED),
    ("claim_curriculum.py:variant=tiny", "curriculum", SHARED),
]


@pytest.fixture(scope="module")
def tiny_claims(tmp_path_factory):
    root = tmp_path_factory.mktemp("claims")
    for config, workdir, extra in TINY_SWEEPS:
        cmd = [sys.executable, "-m", "experiments.sweep", "--config", f"experiments/configs/{config}",
               "--workdir", str(root / workdir), "--seeds", "0,1", "--parallel", "1",
               *(x.replace("{root}", str(root)) for x in extra)]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, env={**os.environ, "XLA_FLAGS": ""})
    return root


@pytest.mark.slow
@pytest.mark.parametrize("path", CLAIM_NOTEBOOKS, ids=lambda p: p.name)
def test_claim_notebooks_on_tiny_sweeps(path, tiny_claims, tmp_path, monkeypatch):
    nb = _execute(path, tmp_path, monkeypatch, tiny_claims)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "(2 seeds)" in text  # it found the tiny sweep's runs
