"""The persistent compilation cache (rl/compile_cache.py): where "auto" points, the opt-outs, that a tiny program
is written to the cache and read back by a second process, and that compile time is counted."""
import json
import os
import subprocess
import sys

from rl import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_auto_is_the_users_cache_dir_and_off_opts_out(tmp_path):
    home = {"HOME": str(tmp_path)}
    assert compile_cache.resolve("auto", home) == os.path.join(str(tmp_path), ".cache", "mathrl", "jax")
    assert compile_cache.resolve("auto", {**home, "XDG_CACHE_HOME": "/x"}) == "/x/mathrl/jax"
    assert compile_cache.resolve("auto", {**home, "MATHRL_JAX_CACHE": "/y"}) == "/y"
    assert compile_cache.resolve("auto", {**home, "MATHRL_JAX_CACHE": "off"}) is None
    assert compile_cache.resolve("off", home) is None and compile_cache.resolve("/z/c", home) == "/z/c"


PROGRAM = """
import json, sys
from rl import compile_cache
compile_cache.enable(sys.argv[1])
import jax, jax.numpy as jnp
jax.jit(lambda x: jnp.tanh(x) * 3.0 + 1.0)(jnp.arange(5.0)).block_until_ready()  # a tiny, fast-compiling program
print(json.dumps(compile_cache.stats()))
"""


def _stats(setting: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROGRAM, setting], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_tiny_program_is_cached_and_read_back_by_the_next_process(tmp_path):
    cache = tmp_path / "jax"
    cold = _stats(str(cache))
    assert cold["cache_misses"] >= 1 and cold["cache_hits"] == 0 and cold["seconds"] > 0
    assert any(n.startswith("jit__lambda") for n in os.listdir(cache))  # cached although it compiled in ms
    warm = _stats(str(cache))
    assert warm["cache_hits"] >= 1 and warm["cache_misses"] == 0
    off = _stats("off")
    assert off["cache_hits"] == 0 and off["cache_misses"] == 0 and off["compiles"] >= 1
