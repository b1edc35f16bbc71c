"""TFDS: materialise any project source as an array_record TFDS dataset and prepare catalog math datasets
(math_dataset, huggingface:gsm8k/main, huggingface:competition_math); reading them back is rl/tasks/tfds_reader.py
(read_split, load_catalog, load_problems), which the task registry imports: this builder writes a mix through the
registry, so it sits above both.

No TensorFlow is needed anywhere here: TFDS writes array_record files and `tfds.data_source` reads them with
NumPy only (tests/test_tasks_tfds.py asserts that `tensorflow` is never imported).

Project datasets (`MathrlTasks`, TFDS name `mathrl_tasks`):
    path = build_dataset("arith:0.5,linear:0.5", data_dir="data/tfds", n_train=5000, n_validation=500,
                         n_test=500, seed=0)                      # -> data/tfds/mathrl_tasks/<config>/1.0.0
    ds = tfds.data_source("mathrl_tasks/<config>", split="train", data_dir="data/tfds")   # random access
    problems = tfds_reader.read_split(path, "train")              # back to Problem objects, original order
    load_mix("tfds@mathrl_tasks/<config>@data/tfds:1", ...)       # as a mix source
The config name is derived from the spec and counts (`config_name_for`) unless given. Each split holds the
problems of `load_mix(spec, n_split, seed, split, difficulty)`, so splits stay disjoint by question hash.
Command line: python -m rl.tasks.tfds_builder build --spec arith:1 --data_dir data/tfds --n_train 1000

Catalog datasets: `tfds_reader.load_catalog(name, split, data_dir)` reads a dataset that was PREPARED BEFOREHAND in
array_record format under data_dir (default $TFDS_DATA_DIR or ~/tensorflow_datasets). It looks for the
prepared directory on disk first and never touches the network: when it is absent it raises
`CatalogNotPrepared` at once, with the command that prepares it on a machine with network access:
    python -m rl.tasks.tfds_builder prepare huggingface:gsm8k/main --data_dir DIR
(`prepare_catalog`, which calls `tfds.builder(name, file_format="array_record").download_and_prepare()`;
huggingface: names also need the `datasets` package). Field mapping:
    math_dataset/<module>         question, answer                                   (no steps, difficulty 1)
    huggingface:gsm8k/main        question; answer after "####"; steps = the reasoning lines, <<calc>> removed
    huggingface:competition_math  problem; answer = last \\boxed{...} of the solution; difficulty = "Level k"
(the mapping of the gsm8k@ / math@ JSONL sources, rl/tasks/gsm8k_math.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import socket

import numpy as np
import tensorflow_datasets as tfds

from rl.tasks import load_mix, parse_mix
from rl.tasks.base import SPLITS
from rl.tasks.tfds_reader import DATASET_NAME, default_data_dir

VERSION = "1.0.0"


@dataclasses.dataclass(eq=False)
class TasksConfig(tfds.core.BuilderConfig):
    """Which project mix to materialise and how many problems per split."""

    spec: str = "arith:1"
    n_train: int = 1000
    n_validation: int = 100
    n_test: int = 100
    seed: int = 0
    difficulty: int | None = None


def config_name_for(spec: str, n_train: int, n_validation: int, n_test: int, seed: int,
                    difficulty: int | None) -> str:
    """A readable, valid TFDS config name, e.g. `arith-0.5_linear-0.5_n1000-100-100_s0_dall`."""
    body = re.sub(r"[^a-z0-9]+", "_", spec.lower().replace(":", "-").replace(".", "p")).strip("_")
    return f"{body}_n{n_train}-{n_validation}-{n_test}_s{seed}_d{'all' if difficulty is None else difficulty}"


class MathrlTasks(tfds.core.GeneratorBasedBuilder):
    """A project task mix as a TFDS dataset (built locally; nothing is downloaded)."""

    name = DATASET_NAME
    RELEASE_NOTES = {VERSION: "Project task sources rendered as problems (question, answer, steps)."}
    VERSION = tfds.core.Version(VERSION)  # after RELEASE_NOTES: its key must stay the module-level str

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        # TFDS locates a builder's source file to look for download checksums next to it; for a builder
        # inside a regular package that lookup imports the `importlib_resources` backport, which is not a
        # dependency here. This builder downloads nothing, so there is no checksum file to find.
        return None

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Math problems from the project's task sources (rl/tasks).",
            features=tfds.features.FeaturesDict({
                "index": np.int64,  # position in load_mix's output, to restore the order on reading
                "id": tfds.features.Text(),
                "question": tfds.features.Text(),
                "answer": tfds.features.Text(),
                "has_steps": np.bool_,  # distinguishes "no worked solution" from an empty list
                "steps": tfds.features.Sequence(tfds.features.Text()),
                "difficulty": np.int32,
                "source": tfds.features.Text(),
            }),
        )

    def _split_generators(self, dl_manager):
        cfg = self.builder_config
        counts = {"train": cfg.n_train, "validation": cfg.n_validation, "test": cfg.n_test}
        return {split: self._generate_examples(split, counts[split]) for split in SPLITS if counts[split] > 0}

    def _generate_examples(self, split: str, n: int):
        cfg = self.builder_config
        for i, p in enumerate(load_mix(cfg.spec, n, cfg.seed, split, cfg.difficulty)):
            if p.reward != "math":  # the features below hold no reward / check payload: refuse, never drop it
                raise ValueError(f"TFDS export holds math problems only; {p.source!r} problems (reward "
                                 f"{p.reward!r}) need their check payload: use rl.tasks.jsonl_io.write_jsonl")
            yield f"{i:09d}", {
                "index": i, "id": p.id, "question": p.question, "answer": p.answer,
                "has_steps": p.steps is not None, "steps": list(p.steps or ()), "difficulty": p.difficulty,
                "source": p.source,
            }


def build_dataset(spec: str, data_dir: str, n_train: int = 1000, n_validation: int = 100, n_test: int = 100,
                  seed: int = 0, difficulty: int | None = None, config_name: str | None = None) -> str:
    """Materialise a mix as `mathrl_tasks/<config>` in array_record format; returns the prepared directory.
    Re-running with the same arguments reuses the prepared files."""
    parse_mix(spec)  # fail on a bad spec before TFDS creates any directory
    name = config_name or config_name_for(spec, n_train, n_validation, n_test, seed, difficulty)
    config = TasksConfig(name=name, version=VERSION, release_notes={}, spec=spec, n_train=n_train, n_validation=n_validation,
                         n_test=n_test, seed=seed, difficulty=difficulty,
                         description=f"load_mix({spec!r}, seed={seed}, difficulty={difficulty})")
    builder = MathrlTasks(config=config, data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare()
    return str(builder.data_path)


def _reachable(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def prepare_catalog(name: str, data_dir: str) -> str:
    """Download and prepare a catalog dataset in array_record format (needs network access; fails fast and
    clearly without it). Returns the prepared directory."""
    host = "huggingface.co" if name.startswith("huggingface:") else "storage.googleapis.com"
    if name.startswith("huggingface:"):
        try:
            import datasets  # noqa: F401 - optional: only huggingface: catalog datasets need it
        except ImportError as e:
            raise RuntimeError(f"preparing {name!r} needs the Hugging Face `datasets` package: pip install datasets") from e
    if not _reachable(host):
        raise RuntimeError(f"cannot prepare {name!r}: {host} is not reachable from this machine. "
                           f"Prepare it where the network is available and copy {data_dir} here.")
    builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare()
    return str(builder.data_path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="materialise a project mix as mathrl_tasks/<config>")
    b.add_argument("--spec", required=True)
    b.add_argument("--data_dir", required=True)
    b.add_argument("--n_train", type=int, default=1000)
    b.add_argument("--n_validation", type=int, default=100)
    b.add_argument("--n_test", type=int, default=100)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--difficulty", type=int, default=None)
    b.add_argument("--config_name", default=None)
    p = sub.add_parser("prepare", help="download + prepare a catalog dataset (needs network)")
    p.add_argument("name")
    p.add_argument("--data_dir", default=default_data_dir())
    args = parser.parse_args(argv)
    if args.cmd == "build":
        path = build_dataset(args.spec, args.data_dir, args.n_train, args.n_validation, args.n_test, args.seed,
                             args.difficulty, args.config_name)
    else:
        path = prepare_catalog(args.name, args.data_dir)
    print(path)


if __name__ == "__main__":
    main()
