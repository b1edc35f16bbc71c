"""Tests for rl/tasks/tfds_builder.py: a project mix materialised as an array_record TFDS dataset and read back
with tfds.data_source (also with TensorFlow made unimportable), catalog adapters on locally built datasets of
the catalog shapes, and the fast, clear failure when a catalog dataset is not prepared."""
import os
import subprocess
import sys
import time

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core import registered

from rl.tasks import get_source, load_mix
from rl.tasks import tfds_builder as tb
from rl.tasks import tfds_reader as tr

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = "arith:0.5,linear:0.3,word_zh:0.2"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    path = tb.build_dataset(SPEC, data_dir, n_train=40, n_validation=8, n_test=8, seed=3)
    return data_dir, path


def test_round_trip_matches_load_mix(built):
    data_dir, path = built
    assert path.startswith(os.path.join(data_dir, "mathrl_tasks"))
    assert any(f.startswith("mathrl_tasks-train.array_record") for f in os.listdir(path))
    for split, n in (("train", 40), ("validation", 8), ("test", 8)):
        assert tr.read_split(path, split) == load_mix(SPEC, n, 3, split)


def test_tfds_data_source_by_name_offline(built):
    data_dir, path = built
    config = os.path.basename(os.path.dirname(path))
    ds = tfds.data_source(f"mathrl_tasks/{config}", split="test", data_dir=data_dir)
    assert len(ds) == 8
    rec = ds[0]
    assert set(rec) == {"index", "id", "question", "answer", "has_steps", "steps", "difficulty", "source"}
    assert isinstance(rec["question"], bytes) and int(rec["difficulty"]) in range(1, 6)


def test_rebuild_reuses_files(built):
    data_dir, path = built
    start = time.process_time()  # CPU seconds: a busy machine does not change the verdict
    assert tb.build_dataset(SPEC, data_dir, n_train=40, n_validation=8, n_test=8, seed=3) == path
    assert time.process_time() - start < 5


def test_tfds_mix_source(built):
    data_dir, path = built
    config = os.path.basename(os.path.dirname(path))
    name = f"tfds@mathrl_tasks/{config}@{data_dir}"
    src = get_source(name)
    assert len(src.problems) == 56
    val = load_mix(f"{name}:1", 5, 0, "validation")
    assert len(val) == 5 and {p.source for p in val} <= {"arith", "linear", "word_zh"}


def test_bad_spec_fails_before_building(tmp_path):
    with pytest.raises(ValueError, match="unknown source"):
        tb.build_dataset("nope:1", str(tmp_path))
    assert not os.listdir(tmp_path)
    assert tb.config_name_for("arith:0.5,linear:0.5", 10, 2, 2, 0, None) == "arith_0p5_linear_0p5_n10-2-2_s0_dall"


_NO_TF = """
import sys


class HideTensorflow:
    # Wraps each import finder so that tensorflow is "not installed" (find_spec gives None), even on a
    # machine that has it.
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [HideTensorflow(f) for f in sys.meta_path]
import importlib.util
assert importlib.util.find_spec("tensorflow") is None
import tensorflow_datasets as tfds
from rl.tasks import tfds_builder as tb
from rl.tasks import tfds_reader as tr
path = tb.build_dataset("arith:1", sys.argv[1], n_train=12, n_validation=0, n_test=3, seed=0)
ds = tfds.data_source("mathrl_tasks/" + path.split("/")[-2], split="train", data_dir=sys.argv[1])
assert len(ds) == 12 and len(tr.read_split(path, "test")) == 3
print("ok", "tensorflow" in sys.modules)
"""


def test_build_and_read_without_tensorflow(tmp_path):
    res = subprocess.run([sys.executable, "-c", _NO_TF, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok False")


@pytest.mark.parametrize("name", ["math_dataset/algebra__linear_1d", "huggingface:gsm8k/main",
                                  "huggingface:competition_math"])
def test_catalog_not_prepared_fails_fast_and_clearly(tmp_path, name):
    start = time.process_time()  # CPU seconds: a busy machine does not change the verdict
    with pytest.raises(tr.CatalogNotPrepared) as info:
        tr.load_catalog(name, "train", data_dir=str(tmp_path))
    assert time.process_time() - start < 2
    message = str(info.value)
    assert name in message and str(tmp_path) in message
    assert f"python -m rl.tasks.tfds_builder prepare {name}" in message and "array_record" in message
    with pytest.raises(tr.CatalogNotPrepared):
        get_source(f"tfds@{name}@{tmp_path}")


def test_gsm8k_fields():
    q, a, steps = tr.gsm8k_to_fields(
        " Tom has 3 bags of 4 apples and buys 1,000 more. How many? ",
        "Tom has 3*4=<<3*4=12>>12 apples.\nThen 12+1000=<<12+1000=1012>>1012.\n#### 1,012")
    assert q.startswith("Tom") and a == "1012"
    assert steps == ("Tom has 3*4=12 apples.", "Then 12+1000=1012.")
    with pytest.raises(ValueError, match="####"):
        tr.gsm8k_to_fields("q", "no final answer")


def test_competition_math_fields():
    # the catalog mapping is the math@ JSONL source's (rl/tasks/gsm8k_math.py; more cases in test_tasks_gsm8k_math)
    from rl.tasks.gsm8k_math import last_boxed, math_to_fields

    assert last_boxed(r"so \boxed{1} then \boxed{\frac{a}{b^{2}}}.") == r"\frac{a}{b^{2}}"
    assert last_boxed("no box") is None
    q, a, d = math_to_fields("Find x.", r"We get $x=\boxed{ 5 }$.", "Level 4")
    assert (q, a, d) == ("Find x.", "5", 4)
    assert math_to_fields("q", r"\boxed{2}", "Level ?")[2] == 1


def _write_catalog_shaped(data_dir: str, name: str, config: str | None, features: dict, rows: dict):
    """A tiny local dataset with a catalog dataset's directory layout and features (no download)."""

    with registered.skip_registration():
        class Local(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")
            RELEASE_NOTES = {"1.0.0": "test"}

            @tfds.core.utils.classproperty
            @classmethod
            def code_path(cls):  # see MathrlTasks.code_path
                return None

            def _info(self):
                return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

            def _split_generators(self, dl_manager):
                return {split: self._generate_examples(split) for split in rows}

            def _generate_examples(self, split):
                for i, row in enumerate(rows[split]):
                    yield i, row

        Local.name = name
        kwargs = {}
        if config:
            kwargs["config"] = tfds.core.BuilderConfig(name=config, version="1.0.0", release_notes={})
        builder = Local(data_dir=data_dir, file_format="array_record", **kwargs)
        builder.download_and_prepare()
        return str(builder.data_path)


def test_catalog_adapters_on_local_datasets(tmp_path):
    data_dir = str(tmp_path)
    text = tfds.features.Text()
    _write_catalog_shaped(data_dir, "gsm8k", "main", {"question": text, "answer": text}, {
        "train": [{"question": "A pen costs 2. How much are 3 pens?", "answer": "3*2=<<3*2=6>>6\n#### 6"}],
        "test": [{"question": "What is 5+5?", "answer": "5+5=<<5+5=10>>10\n#### 10"}]})
    _write_catalog_shaped(data_dir, "competition_math", None,
                          {"problem": text, "solution": text, "level": text, "type": text}, {
        "test": [{"problem": "Compute 1/2+1/2.", "solution": r"It is $\boxed{1}$.", "level": "Level 2",
                  "type": "Algebra"}]})
    _write_catalog_shaped(data_dir, "math_dataset", "numbers__gcd", {"question": text, "answer": text}, {
        "train": [{"question": "What is the gcd of 4 and 6?", "answer": "2"}]})

    (gsm,) = tr.load_catalog("huggingface:gsm8k/main", "test", data_dir=data_dir)
    assert (gsm.question, gsm.answer, gsm.steps) == ("What is 5+5?", "10", ("5+5=10",))
    assert gsm.source == "tfds:huggingface:gsm8k/main"
    (cm,) = tr.load_catalog("huggingface:competition_math", "test", data_dir=data_dir)
    assert (cm.answer, cm.difficulty, cm.steps) == ("1", 2, None)
    (md,) = tr.load_catalog("math_dataset/numbers__gcd", "train", data_dir=data_dir)
    assert (md.question, md.answer) == ("What is the gcd of 4 and 6?", "2")
    with pytest.raises(ValueError, match="splits"):
        tr.load_catalog("huggingface:competition_math", "train", data_dir=data_dir)
    # As a mix source the official splits are pooled and re-split by question hash.
    assert len(get_source(f"tfds@huggingface:gsm8k/main@{data_dir}").problems) == 2


def test_prepare_command_help_runs():
    res = subprocess.run([sys.executable, "-m", "rl.tasks.tfds_builder", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert res.returncode == 0 and "build" in res.stdout and "prepare" in res.stdout
