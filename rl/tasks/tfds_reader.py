"""TFDS datasets read back offline as Problems: a project dataset (`mathrl_tasks/<config>`, written by
rl/tasks/tfds_builder.py) and catalog math datasets prepared beforehand (math_dataset, huggingface:gsm8k/main,
huggingface:competition_math). The task registry (rl/tasks/__init__.py) reads a `tfds@NAME` source through
load_problems; the builder, which writes a mix of sources through that registry, sits above both (no import circle).

    problems = read_split(path, "train")                   # a project dataset's split, in its original order
    problems = load_catalog("huggingface:gsm8k/main", "test", data_dir)   # CatalogNotPrepared when absent
    problems = load_problems("mathrl_tasks/<config>", data_dir)           # every split, as a tfds@ source reads it

No TensorFlow is needed: `tfds.data_source` reads array_record files with NumPy only (tests/test_tasks_tfds.py
asserts that `tensorflow` is never imported). A catalog dataset is looked for on disk first and the network is
never touched: the error names the command that prepares it (python -m rl.tasks.tfds_builder prepare NAME).
"""
from __future__ import annotations

import os
import re

import numpy as np
import tensorflow_datasets as tfds

from rl.tasks.base import Problem, make_id
from rl.tasks.gsm8k_math import gsm8k_to_fields, math_to_fields  # the field mapping of the JSONL readers

DATASET_NAME = "mathrl_tasks"


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def record_to_problem(rec: dict) -> Problem:
    """A `mathrl_tasks` record (as tfds.data_source returns it) -> Problem."""
    steps = tuple(_text(s) for s in rec["steps"]) if bool(rec["has_steps"]) else None
    return Problem(id=_text(rec["id"]), question=_text(rec["question"]), answer=_text(rec["answer"]), steps=steps,
                   difficulty=int(rec["difficulty"]), source=_text(rec["source"]))


def read_split(path: str, split: str) -> list[Problem]:
    """All problems of one split of a prepared `mathrl_tasks` directory, in their original order."""
    source = tfds.builder_from_directory(path).as_data_source(split=split)
    records = [source[i] for i in range(len(source))]
    records.sort(key=lambda r: int(r["index"]))
    return [record_to_problem(r) for r in records]


# ---------------------------------------------------------------------------------------------- catalog


class CatalogNotPrepared(FileNotFoundError):
    """A catalog dataset is not prepared on this machine (and nothing is downloaded to fix that)."""


def default_data_dir() -> str:
    return os.environ.get("TFDS_DATA_DIR") or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")


def _split_name(name: str) -> tuple[str, str | None]:
    """"huggingface:gsm8k/main" -> ("gsm8k", "main"); "math_dataset/algebra__linear_1d" -> (..., ...).
    Hugging Face names are converted the way TFDS names their directories (lower case, "-" -> "_")."""
    hf = name.startswith("huggingface:")
    bare = name.split(":", 1)[1] if ":" in name else name
    dataset, _, config = bare.partition("/")
    if hf:
        dataset, config = dataset.lower().replace("-", "_"), config.lower().replace("-", "_")
    return dataset, (config or None)


def find_prepared(name: str, data_dir: str | None = None) -> str | None:
    """The newest prepared version directory of a TFDS dataset under data_dir (None when absent). Looks at
    <data_dir>/<dataset>[/<config>]/<version>/dataset_info.json, also under a `huggingface/` namespace dir."""
    data_dir = data_dir or default_data_dir()
    dataset, config = _split_name(name)
    found = []
    for root in (data_dir, os.path.join(data_dir, "huggingface")):
        base = os.path.join(root, dataset, config) if config else os.path.join(root, dataset)
        if not os.path.isdir(base):
            continue
        for version in os.listdir(base):
            if (os.path.isfile(os.path.join(base, version, "dataset_info.json"))
                    and re.fullmatch(r"\d+\.\d+\.\d+", version)):
                found.append((tuple(int(x) for x in version.split(".")), os.path.join(base, version)))
    return max(found)[1] if found else None


def _not_prepared_message(name: str, data_dir: str) -> str:
    if _split_name(name)[0] == DATASET_NAME:
        return (f"TFDS dataset {name!r} is not built under {data_dir!r}. Build it with\n"
                f"    python -m rl.tasks.tfds_builder build --spec SPEC --data_dir {data_dir} [--n_train N ...]\n"
                f"(or rl.tasks.tfds_builder.build_dataset) and use the config name it prints.")
    return (f"TFDS dataset {name!r} is not prepared under {data_dir!r} (no <dataset>/<config>/<version>/"
            f"dataset_info.json there), and this code never downloads data. On a machine with network access run\n"
            f"    python -m rl.tasks.tfds_builder prepare {name} --data_dir DIR\n"
            f"(huggingface: datasets also need `pip install datasets`), then copy DIR to this machine and pass "
            f"data_dir=DIR or set TFDS_DATA_DIR=DIR. The data must be in array_record format (the prepare "
            f"command does that) because it is read with tfds.data_source, without TensorFlow.")


def catalog_record_to_problem(name: str, rec: dict) -> Problem:
    """Map one catalog record to a Problem (field mapping in the module docstring)."""
    dataset, _ = _split_name(name)
    source = f"tfds:{name}"
    if dataset == "gsm8k":
        q, a, steps = gsm8k_to_fields(_text(rec["question"]), _text(rec["answer"]))
        return Problem(id=make_id(source, q), question=q, answer=a, steps=steps, difficulty=1, source=source)
    if dataset == "competition_math":
        q, a, d = math_to_fields(_text(rec["problem"]), _text(rec["solution"]), _text(rec.get("level", "")))
        return Problem(id=make_id(source, q), question=q, answer=a, steps=None, difficulty=d, source=source)
    if dataset == DATASET_NAME:
        return record_to_problem(rec)
    # math_dataset/<module> and any other dataset with question / answer text fields.
    if "question" not in rec or "answer" not in rec:
        raise ValueError(f"TFDS dataset {name!r} has no question/answer fields (has {sorted(rec)})")
    q, a = _text(rec["question"]).strip(), _text(rec["answer"]).strip()
    return Problem(id=make_id(source, q), question=q, answer=a, steps=None, difficulty=1, source=source)


def load_catalog(name: str, split: str, data_dir: str | None = None, limit: int | None = None) -> list[Problem]:
    """Problems of one split of a prepared catalog (or project) TFDS dataset, in the dataset's own split.
    Raises CatalogNotPrepared immediately (no network access) when it is not on disk."""
    data_dir = data_dir or default_data_dir()
    path = find_prepared(name, data_dir)
    if path is None:
        raise CatalogNotPrepared(_not_prepared_message(name, data_dir))
    builder = tfds.builder_from_directory(path)
    if split not in builder.info.splits:
        raise ValueError(f"TFDS dataset {name!r} at {path} has splits {sorted(builder.info.splits)}, not {split!r}")
    source = builder.as_data_source(split=split)
    n = len(source) if limit is None else min(limit, len(source))
    return [catalog_record_to_problem(name, source[i]) for i in range(n)]


def load_problems(name: str, data_dir: str | None = None) -> list[Problem]:
    """Every split of a prepared TFDS dataset pooled (the `tfds@...` mix source re-splits them by question
    hash, which keeps the project's split guarantee; use load_catalog for a dataset's own official split)."""
    data_dir = data_dir or default_data_dir()
    path = find_prepared(name, data_dir)
    if path is None:
        raise CatalogNotPrepared(_not_prepared_message(name, data_dir))
    problems = []
    for split in tfds.builder_from_directory(path).info.splits:
        problems += load_catalog(name, split, data_dir)
    return problems
