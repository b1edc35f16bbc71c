"""Test setup: 8 forced CPU devices for sharding tests, set before JAX starts; JAX's persistent compilation cache
(rl/compile_cache.py: the user's cache directory, MATHRL_JAX_CACHE=off turns it off), so a second run of the
suite reads its compiled programs back instead of compiling them again. The time estimate's machine calibration
(rl/calibration.py) goes to its own file, so the suite's 8 forced devices do not replace a real run's figures. The
PRM wing is installed as the entry points install it (prm.install(): its reward term and its "prm" objective)."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MATHRL_CALIBRATION", os.path.join(os.path.expanduser("~"), ".cache", "mathrl",
                                                         "calibration-tests.json"))

import prm  # noqa: E402 - after the environment above, as every import here
from rl import compile_cache  # noqa: E402 - after the environment above, which JAX reads when it starts

compile_cache.enable("auto")
prm.install()
