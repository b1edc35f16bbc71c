"""Executes every notebook under notebooks/ top to bottom; a notebook that raises fails the test."""
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
SLOW = {"grpo_vs_ppo.ipynb"}  # notebooks that train a policy take minutes


@pytest.mark.parametrize(
    "path", [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW else p for p in NOTEBOOKS], ids=lambda p: p.name
)
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent.parent)}}).execute()
    assert any(o.get("text", "").strip().endswith("ok") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
