"""The sympy side of the answer verifier: node trees as sympy expressions, and the worker child that proves claims.

    python -m rewards._sympy_child      # started by rewards._verify_worker.SympyWorker, one per process

`to_sympy(node)` builds a sympy expression from a rewards.mathparse tree with sympy constructors (never from text);
Bomb for huge powers and factorials. `main()` is the child's loop: it reads (id, op, a, b) frames from stdin
(rewards._verify_worker's length-prefixed pickles), answers True / False / None per `_confirm`, under a 2 GiB
address-space limit, and dies with its parent.

Only this process imports sympy: the verifier, the reward pool's workers and the trainer import
rewards._verify_worker (the client), which stays free of it.
"""
from __future__ import annotations

import pickle
import resource
import signal
import sys

import sympy

from rewards import _verify_eval as ev
from rewards._lifeline import die_with_parent
from rewards._verify_worker import HEADER, MAX_FRAME, MEMORY_LIMIT, READY, read_exact, write_frame


def to_sympy(node):
    """The node tree as a sympy expression, built with sympy constructors; Bomb for huge powers and factorials."""
    kind = node[0]
    if kind == "num":
        return sympy.Rational(node[1].numerator, node[1].denominator)
    if kind == "sym":
        return sympy.Symbol(node[1])
    if kind == "const":
        return {"pi": sympy.pi, "E": sympy.E, "oo": sympy.oo}[node[1]]
    if kind == "neg":
        return -to_sympy(node[1])
    if kind in ("+", "-", "*", "/"):
        return ev.binary(kind, to_sympy(node[1]), to_sympy(node[2]), ev.EvalError)
    if kind == "^":
        base, ex = to_sympy(node[1]), to_sympy(node[2])
        if ex.is_Integer and base.is_number:
            if abs(int(ex)) > ev.MAX_SYMPY_POW:
                raise ev.Bomb("exponent too large")
        elif ex.is_number and not ex.is_Rational and base.is_number:
            if abs(complex(ex.evalf(15))) > ev.MAX_SYMPY_POW:
                raise ev.Bomb("exponent too large")
        elif ex.is_Rational and abs(ex) > ev.MAX_SYMPY_POW:
            raise ev.Bomb("exponent too large")
        return sympy.Pow(base, ex)
    if kind == "fact":
        arg = to_sympy(node[1])
        if arg.is_number and (not arg.is_Integer or int(arg) > ev.MAX_SYMPY_FACT):
            raise ev.Bomb("factorial argument")
        return sympy.factorial(arg)
    if kind == "pct":
        return to_sympy(node[1]) / 100
    if kind == "fn":
        args = [to_sympy(a) for a in node[2]]
        name = node[1]
        table = {"sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan,
                 "cot": sympy.cot, "sec": sympy.sec, "csc": sympy.csc, "asin": sympy.asin,
                 "acos": sympy.acos, "atan": sympy.atan, "sinh": sympy.sinh, "cosh": sympy.cosh,
                 "tanh": sympy.tanh, "ln": sympy.log, "exp": sympy.exp, "abs": sympy.Abs,
                 "floor": sympy.floor, "ceiling": sympy.ceiling, "factorial": sympy.factorial}
        if name == "log":
            return sympy.log(*args) if len(args) <= 2 else _bad(name)
        if name == "log10":
            return sympy.log(args[0], 10)
        if name == "binomial" and len(args) == 2:
            return sympy.binomial(*args)
        if name in table and len(args) == 1:
            if name == "exp" and args[0].is_number and abs(complex(args[0].evalf(15))) > ev.MAX_SYMPY_POW:
                raise ev.Bomb("exp argument")
            return table[name](args[0])
        return _bad(name)
    if kind == "call":
        return sympy.Function(node[1])(*[to_sympy(a) for a in node[2]])
    raise ev.EvalError(kind)


def _bad(name):
    raise ev.EvalError(f"function {name}")


def _confirm(op: str, a, b):
    """True: sympy proves the claim; False: sympy proves it wrong; None: undecided."""
    try:
        ea, eb = to_sympy(a), to_sympy(b)
    except ev.Bomb:
        return False
    if op == "expr":
        diff = ea - eb
        if diff == 0:
            return True
        for step in (sympy.expand, sympy.simplify):
            diff = step(diff)
            if diff == 0:
                return True
        if diff.is_number and diff.free_symbols == set():
            return abs(complex(diff.evalf(30))) < 1e-20
        return None
    if op == "ratio":  # two expressions equal up to a nonzero constant factor
        if eb == 0:
            return ea == 0
        ratio = sympy.cancel(sympy.simplify(ea / eb))
        if ratio.free_symbols:
            return None
        return bool(ratio != 0)
    raise ValueError(f"unknown op {op}")


def main() -> None:
    die_with_parent()  # SIGKILLed with the process that started it (a reward worker or the trainer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    write_frame(fd_out, (READY, None))
    while True:
        try:
            (size,) = HEADER.unpack(read_exact(fd_in, HEADER.size))
            if size > MAX_FRAME:
                return
            req_id, op, a, b = pickle.loads(read_exact(fd_in, size))
        except EOFError:
            return
        try:
            result = _confirm(op, a, b)
        except Exception:  # an exception in sympy is an undecided answer, not a crash
            result = None
        write_frame(fd_out, (req_id, result))


if __name__ == "__main__":
    main()
