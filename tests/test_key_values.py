"""The one reader of comma-separated key=value lists (schema.key_values) and the four places that read
such lists through it: a config file's arg, gym generator settings, tasks.source_levels and mesh.rules."""
import pytest

from experiments.configs.common import parse_arg
from rl.config_validation import ConfigError, parse_rules, parse_source_levels
from rl.tasks.gym import parse_settings
from schema import key_values


def test_key_values_splits_strips_and_skips_empty_items():
    assert key_values(" a = 1 ,, b=x y , c=") == [("a", "1"), ("b", "x y"), ("c", "")]
    assert key_values("") == []


@pytest.mark.parametrize("text, message", [
    ("a=1,b", "item 'b' must be key=value"),
    ("=3", "item '=3' must be key=value"),
    ("a=1,a=2", "item 'a' is given twice"),
])
def test_key_values_names_the_bad_item(text, message):
    with pytest.raises(ValueError, match=message):
        key_values(text)


def test_every_reader_of_pairs_goes_through_it():
    assert parse_arg("variant=tiny,seed=3") == {"variant": "tiny", "seed": 3}
    assert parse_settings("max_terms=3,seed=a|b") == {"max_terms": 3, "seed": ("a", "b")}
    assert parse_source_levels("code=1, add=2") == {"code": 1, "add": 2}
    assert parse_rules("embed=fsdp,batch=data+fsdp,vocab=") == {"embed": "fsdp", "batch": ("data", "fsdp"),
                                                                 "vocab": None}
    with pytest.raises(ConfigError, match="config arg 'seed' is given twice"):
        parse_arg("seed=1,seed=2")
    with pytest.raises(ValueError, match="gym setting 'max_terms' must be key=value"):
        parse_settings("max_terms")
    with pytest.raises(ValueError, match="source=level with level 0..5"):
        parse_source_levels("code=9")
    with pytest.raises(ValueError, match="rule 'embed' must be logical=axis"):
        parse_rules("embed")
