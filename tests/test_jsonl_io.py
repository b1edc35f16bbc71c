"""Tests for rl.tasks.jsonl_io: every malformed line becomes an error that names its line number, whatever the
line holds (huge integers, deep nesting, lone surrogates, values whose repr is huge); nothing raises."""
import pytest

from rl.tasks import jsonl_io

GOOD = '{"question": "3+4", "answer": "7"}'


def _write(tmp_path, lines):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
                                for line in lines) + b"\n")
    return str(path)


HOSTILE = {
    "integer over 4300 digits": '{"question": "q", "answer": ' + "9" * 5000 + "}",
    "integer over 4300 digits in difficulty": '{"question": "q", "answer": "1", "difficulty": ' + "1" * 4400 + "}",
    "100k nested brackets": '{"question": ' + "[" * 100_000 + "]" * 100_000 + ', "answer": "1"}',
    "100k nested brackets, unclosed": "[" * 100_000,
    "100k nested objects": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "lone surrogate in question": '{"question": "what is \\ud800 + 1?", "answer": "2"}',
    "lone low surrogate in answer": '{"question": "q", "answer": "\\udfff"}',
    "lone surrogate in steps": '{"question": "q", "answer": "1", "steps": ["ok", "\\ud83d"]}',
    "lone surrogate in a key": '{"question": "q", "answer": "1", "\\ud800": 1}',
    "deeply nested question": '{"question": ' + "[" * 900 + "]" * 900 + ', "answer": "1"}',
    "huge wrong-typed value": '{"question": ' + "[" + ",".join(["1"] * 200_000) + "]" + ', "answer": "1"}',
    "NaN difficulty": '{"question": "q", "answer": "1", "difficulty": NaN}',
    "infinite difficulty": '{"question": "q", "answer": "1", "difficulty": 1e999}',
    "raw invalid UTF-8": b'{"question": "\xed\xa0\x80", "answer": "1"}',
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_line_is_a_numbered_error(tmp_path, name):
    path = _write(tmp_path, [GOOD, HOSTILE[name], GOOD])
    problems, errors = jsonl_io.validate_jsonl(path)
    assert len(problems) == 2  # the good lines around it still load
    assert errors and all(e.line == 2 for e in errors), errors
    assert all(len(str(e)) < 400 for e in errors)  # messages stay readable
    with pytest.raises(jsonl_io.JsonlError) as info:
        jsonl_io.read_jsonl(path)
    assert "line 2" in str(info.value)


def test_messages_name_the_cause(tmp_path):
    path = _write(tmp_path, [HOSTILE["integer over 4300 digits"], HOSTILE["100k nested brackets"],
                             HOSTILE["lone surrogate in question"], HOSTILE["lone surrogate in steps"]])
    _, errors = jsonl_io.validate_jsonl(path)
    by_line = {e.line: e for e in errors}
    assert "long numbers as strings" in by_line[1].message
    assert "nested too deeply" in by_line[2].message
    assert by_line[3].field == "question" and "lone surrogate '\\ud800' at character 8" in by_line[3].message
    assert by_line[4].field == "steps" and "surrogate" in by_line[4].message


def test_every_bad_line_is_listed(tmp_path):
    lines = [GOOD] + [HOSTILE[k] for k in HOSTILE] + [GOOD]
    _, errors = jsonl_io.validate_jsonl(_write(tmp_path, lines))
    assert sorted({e.line for e in errors}) == list(range(2, 2 + len(HOSTILE)))


def test_valid_unicode_still_loads(tmp_path):
    path = _write(tmp_path, ['{"question": "小明有\\ud83d\\ude00 3 个苹果", "answer": "3"}',
                             '{"question": "x", "answer": ' + "9" * 4300 + "}"])
    problems, errors = jsonl_io.validate_jsonl(path)
    assert errors == [] and problems[0].question == "小明有😀 3 个苹果" and problems[1].answer == "9" * 4300
