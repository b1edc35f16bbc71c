"""The compatibility readers (rl/compat.py): each entry is marked `# compat: NAME` in every file it names, every
mark names an entry, and no entry is past the date after which its reader goes (then remove the reader, or move
the date with the reason in rl/compat.py)."""
import datetime
import re
from pathlib import Path

from rl import compat

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"#\s*compat:\s*([A-Za-z0-9_]+)")


def marks() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for pkg in ("models", "rewards", "rl", "prm", "experiments"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path == ROOT / "rl" / "compat.py":  # the table's own docstring shows the mark
                continue
            for name in MARK.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_shim_is_marked_where_the_table_says_and_every_mark_is_in_the_table():
    found = marks()
    assert set(found) <= set(compat.SHIMS), f"marks without an entry in rl/compat.py: {set(found) - set(compat.SHIMS)}"
    for name, shim in compat.SHIMS.items():
        assert found.get(name) == set(shim.where), (name, found.get(name), shim.where)


def test_no_shim_is_past_its_date():
    today = datetime.date.today()
    for name, shim in compat.SHIMS.items():
        since, until = datetime.date.fromisoformat(shim.since), datetime.date.fromisoformat(shim.remove_after)
        assert since < until
        assert today <= until, f"{name} ({shim.reads}) was to go after {until}: remove it from {shim.where}"
