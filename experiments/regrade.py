"""Re-grade a run's saved answers with this tree's grader, without sampling again (issue 52).

    python -m experiments.regrade runs/smollm2_grpo/seed0/samples.jsonl [--against main] [--kind greedy]
        [--examples 3] [--json out.json]

Reads the records a run (or `experiments.eval`) wrote to samples.jsonl (prompt, response, gold, the reward parts as
scored then), scores every response of the chosen kind (greedy by default: what pass@1 reads) against its gold
with rewards.combine.score, the math families' reward, and prints per evaluation (stage, step, split) the number
of answers n, pass@1 as recorded, pass@1 under the baseline grader (`--against REV`: rewards/ at that git
revision, in a subprocess; without it, the recorded scores), pass@1 under this tree's grader, how many answers
changed, and up to `--examples` answers that flipped each way (their last sentence). Only the math reward is
re-scored: records of other task families (code, instructions, gym) are skipped and counted.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict

from rewards.combine import score

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OTHER_FAMILIES = ("code-", "instructions", "gym")  # problem ids of the families combine.score does not grade

# Runs in a child with the baseline rewards/ first on the path: reads [[response, gold], ...] on stdin, prints solved.
_SCORE_CHILD = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from rewards.combine import score
pairs = json.load(sys.stdin)
print(json.dumps([float(score(text, gold)["solved"]) for text, gold in pairs]))
"""


def load_records(path: str, kind: str = "greedy") -> tuple[list[dict], int]:
    """The math records of `kind` in a samples.jsonl, in file order, and how many of other families were skipped."""
    out, skipped = [], 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("kind") != kind:
                continue
            if str(rec.get("problem_id", "")).startswith(_OTHER_FAMILIES):
                skipped += 1
                continue
            out.append(rec)
    return out, skipped


def solved_here(pairs: list[tuple[str, str]]) -> list[float]:
    """This tree's verdicts (rewards.combine.score's `solved`) on (response, gold) pairs."""
    return [float(score(text, gold)["solved"]) for text, gold in pairs]


def solved_at(rev: str, pairs: list[tuple[str, str]]) -> list[float]:
    """The verdicts of rewards/ at git revision `rev` (extracted to a temporary directory, scored in a child)."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "rewards"], capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory() as old:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(old, filter="data")
        out = subprocess.run([sys.executable, "-c", _SCORE_CHILD, old, ROOT], input=json.dumps(pairs),
                             capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def _last_sentence(text: str, n: int = 110) -> str:
    text = " ".join(text.split())
    return ("…" + text[-n:]) if len(text) > n else text


def compare(records: list[dict], before: list[float], after: list[float], n_examples: int = 3) -> list[dict]:
    """Per evaluation (stage, step, split): n, recorded / before / after pass@1, changed, flipped examples."""
    groups = defaultdict(list)
    for i, rec in enumerate(records):
        groups[(rec.get("stage"), rec.get("step"), rec.get("split"))].append(i)
    rows = []
    for (stage, step, split), idx in groups.items():
        up = [i for i in idx if after[i] > before[i]]
        down = [i for i in idx if after[i] < before[i]]
        rows.append({
            "stage": stage, "step": step, "split": split, "n": len(idx),
            "recorded": sum(float(records[i].get("reward", {}).get("solved") or 0.0) for i in idx) / len(idx),
            "before": sum(before[i] for i in idx) / len(idx), "after": sum(after[i] for i in idx) / len(idx),
            "changed": len(up) + len(down), "up": len(up), "down": len(down),
            "examples_up": [{"gold": records[i]["gold"], "end": _last_sentence(records[i]["response"])}
                            for i in up[:n_examples]],
            "examples_down": [{"gold": records[i]["gold"], "end": _last_sentence(records[i]["response"])}
                              for i in down[:n_examples]],
        })
    return rows


def print_table(rows: list[dict], baseline: str) -> None:
    print(f"| evaluation | split | n | pass@1 recorded | pass@1 {baseline} | pass@1 this tree | changed (up / down) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['stage']} (step {r['step']}) | {r['split']} | {r['n']} | {r['recorded']:.3f} | {r['before']:.3f} "
              f"| {r['after']:.3f} | {r['changed']} ({r['up']} / {r['down']}) |")
    for r in rows:
        for way in ("up", "down"):
            for ex in r[f"examples_{way}"]:
                print(f"  {r['stage']} {r['split']} {way:4} gold {ex['gold']}: {ex['end']!r}")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("samples", help="a samples.jsonl written by a run or by experiments.eval")
    ap.add_argument("--against", default=None, metavar="REV",
                    help="baseline grader: rewards/ at this git revision (default: the scores recorded in the file)")
    ap.add_argument("--kind", default="greedy", help="which records: greedy (pass@1) or 'sample 0', ...")
    ap.add_argument("--examples", type=int, default=3, help="flipped answers shown each way per evaluation")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    records, skipped = load_records(args.samples, args.kind)
    if not records:
        sys.exit(f"no math records of kind {args.kind!r} in {args.samples}")
    pairs = [(rec["response"], rec["gold"]) for rec in records]
    before = (solved_at(args.against, pairs) if args.against
              else [float(rec.get("reward", {}).get("solved") or 0.0) for rec in records])
    rows = compare(records, before, solved_here(pairs), args.examples)
    print_table(rows, args.against or "recorded")
    if skipped:
        print(f"({skipped} records of other task families skipped)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1, ensure_ascii=False)
    return rows


if __name__ == "__main__":
    main()
