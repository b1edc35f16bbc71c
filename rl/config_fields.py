"""The typed-field mechanism (models/fields.py) under its rl/ name, plus the curriculum's three-bucket checks.

    from rl.config_fields import Checked, field, num, integer, from_dict, FieldErrors

Stage configs (rl/stages/), the curriculum and the run sections (rl/config_validation.py) build on it; the model
(models/config.py) and reward (rewards/combine.py) sections use models/fields.py directly (they sit below rl/).
"""
from __future__ import annotations

import math

from models.fields import (Check, Checked, FieldErrors, boolean, choice, construct, default_of, describe, doc_of,
                           field, from_dict, integer, name, num, optional, plain, section_type, suggest, text,
                           unknown_field)

__all__ = ["Check", "Checked", "FieldErrors", "boolean", "choice", "construct", "default_of", "describe", "doc_of",
           "field", "from_dict", "integer", "name", "num", "optional", "plain", "section_type", "suggest", "text",
           "unknown_field", "three_ints", "three_weights"]


def three_ints(lo: int = 1, hi: int = 4096) -> Check:
    def c(v):
        if (not isinstance(v, (tuple, list)) or len(v) != 3
                or any(isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi for x in v)):
            return f"must be 3 ints in [{lo}, {hi}] (easy, medium, hard), got {v!r}"
        return None

    return c


def three_weights(v) -> str | None:
    if (not isinstance(v, (tuple, list)) or len(v) != 3
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 for x in v)):
        return f"must be 3 finite non-negative numbers (easy, medium, hard), got {v!r}"
    if sum(v) <= 0:
        return f"must have a positive sum, got {v!r}"
    return None
