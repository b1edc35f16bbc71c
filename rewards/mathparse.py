"""Safe tokenizer and Pratt parser for math: the one expression parser of rewards/.

Model text is never evaluated: this module turns a short string into a small tree of plain
tuples (no sympy objects, no code), which `rewards._verify_eval` evaluates exactly, numerically
or (in a worker process) as sympy objects, node by node.  Two entry points share the tokenizer,
the grammar and the trees:
    parse_answer(text)       an answer (LaTeX or plain sympy-style syntax), after normalize():
                             used by rewards.verify.is_equiv
    parse_arithmetic(text)   plain arithmetic only (numbers, + - * / ^ ** %, parentheses;
                             juxtaposition only before "(", as in 2(3+4)), no normalisation:
                             used by rewards.steps for step claims, so a claim and an answer with
                             the same text get the same tree and the same value

normalize() also reads Chinese answers: full-width characters are folded to ASCII (６ （ ） ， ：),
a leading qualifier is dropped (约 约为 约等于 大约 大概 近似 approximately about around roughly ≈;
it does not loosen the comparison: "约3.33" is 3.33 compared by the rounding rule, "约3" is 3),
"3分之2" is 2/3, "百分之25" is 25%, the multipliers 十 百 千 万 亿 after a number scale it
("5万" is 50000; 千克 千米 … stay units), and a trailing run of Han characters after a number is
a unit or measure word and is dropped ("6个", "31岁", "6元", "6（个）", "12平方米", "60千米/小时").
Chinese numerals ("六个") are not read.

    >>> parse_answer(r"\\frac{1}{2} + x^2")
    ('+', ('/', ('num', Fraction(1, 1), None), ('num', Fraction(2, 1), None)), ('^', ('sym', 'x'), ('num', Fraction(2, 1), None)))

Node kinds (all tuples, first item the kind):
    ('num', Fraction, ndec)      literal; ndec = digits after the decimal point, None for integers
    ('sym', name) ('const', 'pi'|'E'|'oo')  ('text', words)
    ('+', a, b) ('-', a, b) ('*', a, b) ('/', a, b) ('^', a, b) ('neg', a) ('pm', a|None, b)
    ('fn', name, args)   whitelisted function; ('call', name, args) undefined function f(x)
    ('fact', a) ('pct', a) ('ratio', a, b) ('union', a, b)
    ('seq', open, close, items)  bracketed comma list: tuple or interval
    ('list', items)  bare comma list;  ('set', items)  \\{...\\};  ('matrix', rows)
    ('rel', parts, ops)  chain of = < <= > >= != ~ (approx) in
Limits: MAX_CHARS characters, MAX_TOKENS tokens and MAX_DEPTH nesting; beyond them ParseError.
"""
from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

from rewards.text import FULLWIDTH, brace_pairs, deeper_than

MAX_CHARS = 2000
MAX_TOKENS = 800
MAX_DEPTH = 60


class ParseError(ValueError):
    """The answer is not something this grammar accepts (or exceeds a limit)."""


# ---------------------------------------------------------------------------------------------
# String normalisation (before tokenising)

_DROP_CMDS = re.compile(
    r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg|displaystyle|textstyle|"
    r"limits|nolimits|mathstrut)(?![a-zA-Z])")
_SPACES = re.compile(r"(?<!\\)\\(?:quad|qquad|,|;|:|!| |enspace|thinspace|medspace)|~")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\circ(?![a-zA-Z])|\\degree")
# Linear: a match may start after a digit, } or $, or after the FIRST character of a whitespace run (never inside a
# run, where every start would rescan the rest of it); the leftmost match is the same as with any start allowed.
_PERCENT_WORDS = re.compile(r"(?:(?<=[\d}$])|(?<=\s)(?<!\s\s))\s*(?:percentage|percent|pct)\b", re.IGNORECASE)
_UNIT_WORDS = (
    r"cm|mm|km|m|kg|g|mg|lb|lbs|pounds?|ounces?|oz|s|sec|seconds?|minutes?|mins?|hours?|hrs?|days?|"
    r"weeks?|months?|years?|miles?|mi|feet|foot|ft|inch(?:es)?|in|meters?|metres?|units?|dollars?|"
    r"cents?|yuan|euros?|degrees?|deg|square|sq|cubic|liters?|litres?|ml|L|mph|km/h|m/s|people|times|"
    r"ways|points|students|apples|books|cars|coins|marbles|items|boxes|balls|cookies|candies|pages"
)
_UNITS = re.compile(r"(?<=[\d}])\s*(?:\\(?:text|mbox|textnormal|mathrm|textrm|textit|mathit)\s*\{\s*)?(?:"
                    + _UNIT_WORDS + r")\b\s*\}?(?:\s*\^\s*\{?[23]\}?|[²³])?(?=\s*$|\s*[,;)\]]|\s*\\\})")
_THOUSANDS = re.compile(r"(?<![\d.,(\[{\w])(\d{1,3}(?:,\d{3})+)(\.\d+)?(?![\d,)\]}])")
_SPACE_THOUSANDS = re.compile(r"^\s*-?\d{1,3}(?: \d{3})+(?:\.\d+)?\s*$")
_DECIMAL_COMMA = re.compile(r"^\s*(-?)(\d+),(\d+)\s*$")
_DOUBLED_CMD = re.compile(r"\\\\([a-zA-Z]+|[{}%$])")
_SCIENTIFIC = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d{1,4})(?![\w.])")
_GLUED_OR = re.compile(r"(?<=[\d)}])\s*(?:or|and)\s*(?=[A-Z\\(])")  # "W(x)=1orW(x)=-1"
_FRACS = re.compile(r"\\[dtc]frac(?![a-zA-Z])")
_QUALIFIER = re.compile(r"^\s*(?:约等于|约为|约是|约|大约是|大约为|大约|大概是|大概为|大概|近似于|近似为|近似是|近似|"
                        r"approximately|approx\.?|about|around|roughly|\\approx|≈)\s*", re.IGNORECASE)
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_HAN_CHAR = re.compile(f"[{_HAN}]")
# (?<!\d): a number is read from its first digit only (linear; a start inside a digit run could not match anyway)
_CJK_FRACTION = re.compile(r"(?<!\d)(\d+(?:\.\d+)?)\s*分之\s*(\d+(?:\.\d+)?)")       # 3分之2 = 2/3
_CJK_PERCENT = re.compile(r"百分之\s*(\d+(?:\.\d+)?)")                        # 百分之25 = 25%
_CJK_MULTIPLIER = re.compile(r"(?<!\d)(\d+(?:\.\d+)?)\s*([十百千万亿]+)")
_CJK_POWERS = {"十": 1, "百": 2, "千": 3, "万": 4, "亿": 8}
_SI_UNIT_AFTER = set("克米瓦帕焦卡赫伏")  # 千克 千米 千瓦 …: 千 / 百 before these is part of a unit
_CJK_UNIT = re.compile(rf"(?<=[\d)}}%])\s*(?:\\(?:text|mbox|mathrm|textrm|textnormal)\s*\{{\s*)?(\()?\s*[{_HAN}]{{1,8}}"
                       rf"(?:\s*/\s*[{_HAN}]{{1,8}})?\s*(?(1)\))\s*\}}?(?=\s*$|\s*[,;)\]]|\s*\\\}})")


def _cjk_multiplier(m: re.Match) -> str:
    run = m.group(2)
    nxt = m.string[m.end():m.end() + 1]
    if run[-1] in "十百千" and nxt in _SI_UNIT_AFTER:
        run = run[:-1]  # "3千米": 千 belongs to the unit
    if not run:
        return m.group(0)
    power = sum(_CJK_POWERS[c] for c in run)
    return f"({m.group(1)}*10^{{{power}}})" + m.group(2)[len(run):]


def _read_chinese(s: str) -> str:
    """Qualifiers, Chinese fractions, percentages, multipliers and trailing units (see the module docstring)."""
    s = _QUALIFIER.sub("", s, count=1)
    if _HAN_CHAR.search(s) is None:
        return s
    s = _CJK_FRACTION.sub(r"\2/\1", s)
    s = _CJK_PERCENT.sub(r"\1%", s)
    s = _CJK_MULTIPLIER.sub(_cjk_multiplier, s)
    return _CJK_UNIT.sub("", s).strip()


def normalize(text: str) -> str:
    """Rewrites spacing, units, separators and synonyms so the tokenizer sees one spelling."""
    s = text if text.isascii() else text.translate(FULLWIDTH)
    if "\\begin" not in s and "\\\\" in s:
        s = _DOUBLED_CMD.sub(r"\\\1", s)  # answers copied from escaped JSON: \\frac -> \frac
    s = s.replace("\u2212", "-").replace("\u00a0", " ").replace("{,}", "")
    s = s.replace("\\$", "").replace("\\%", "%").replace("\\\\%", "%")
    s = _FRACS.sub(r"\\frac", s)
    s = _DROP_CMDS.sub("", s)
    s = re.sub(r"(?<=\d),\\!\s*(?=\d{3})", ",", s).replace("\\!", "")
    s = _SPACES.sub(" ", s)
    s = _DEGREES.sub("", s)
    s = _PERCENT_WORDS.sub("%", s)
    s = _GLUED_OR.sub(", ", s)
    s = s.strip().rstrip(".。\\").strip()
    if "$" in s:
        s = s.replace("$", " ").strip()
    s = _read_chinese(s)
    for _ in range(2):
        s = _UNITS.sub("", s).strip()
    s = _SCIENTIFIC.sub(r"(\1*10^{\2})", s)
    if _SPACE_THOUSANDS.match(s):
        s = s.replace(" ", "")
    m = _DECIMAL_COMMA.match(s)
    if m and (m.group(2) == "0" or len(m.group(3)) == 2 or (len(m.group(2)) > 3 and len(m.group(3)) != 3)):
        return f"{m.group(1)}{m.group(2)}.{m.group(3)}"
    return _THOUSANDS.sub(lambda mm: mm.group(1).replace(",", "") + (mm.group(2) or ""), s)


# ---------------------------------------------------------------------------------------------
# Tokenizer

_TOKEN = re.compile(
    r"(?P<ws>\s+)"
    r"|(?P<num>\d+\.\d*|\.\d+|\d+)"
    r"|(?P<rowsep>\\\\)"
    r"|(?P<cmd>\\[a-zA-Z]+)"
    r"|(?P<esc>\\[{}|,;:!%&_#])"
    r"|(?P<word>[A-Za-z]+|[\u0391-\u03c9])"
    r"|(?P<op>\*\*|<=|>=|!=|==|=<|=>|[-+*/^()\[\]{},;=<>!|_&:'%]|[\u2264\u2265\u2260\u00b1\u00d7\u00f7"
    r"\u00b7\u221a\u03c0\u221e\u222a\u2208\u2248\u2217\u22c5])"
)

_UNICODE_OPS = {"\u2264": "<=", "\u2265": ">=", "\u2260": "!=", "\u00b1": "pm", "\u00d7": "*",
                "\u00f7": "/", "\u00b7": "*", "\u2217": "*", "\u22c5": "*", "\u221a": "\\sqrt",
                "\u03c0": "\\pi", "\u221e": "\\infty", "\u222a": "\\cup", "\u2208": "\\in",
                "\u2248": "\\approx", "==": "=", "=<": "<=", "=>": ">="}
_ESCAPES = {"\\{": "\\{", "\\}": "\\}", "\\|": "|", "\\%": "%", "\\_": "_"}
_RAW_TEXT_CMDS = {"\\text", "\\textbf", "\\textnormal", "\\mbox", "\\textrm", "\\textit", "\\textsf",
                  "\\texttt", "\\mathrm", "\\mathbf", "\\mathit", "\\mathsf", "\\mathtt", "\\boldsymbol",
                  "\\operatorname", "\\mathbb", "\\mathcal", "\\emph"}


def _greek_name(ch: str) -> str:
    """The LaTeX name of a Greek letter typed as Unicode: θ -> theta, Δ -> Delta."""
    parts = unicodedata.name(ch, "GREEK SMALL LETTER X").split()
    word = parts[-1].lower().replace("lamda", "lambda")
    return word.capitalize() if "CAPITAL" in parts else word


def tokenize(s: str) -> list[tuple[str, str]]:
    """Returns (kind, text) pairs; kinds: num word cmd op text rowsep.  ParseError on junk."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(s)
    braces = None  # brace pairs, computed on the first \\text{...}
    while i < n:
        m = _TOKEN.match(s, i)
        if not m:
            raise ParseError(f"unexpected character {s[i]!r}")
        kind, text = m.lastgroup, m.group()
        i = m.end()
        if kind == "ws":
            continue
        if kind == "cmd" and text in _RAW_TEXT_CMDS:
            j = i
            while j < n and s[j] == " ":
                j += 1
            if j < n and s[j] == "{":
                braces = brace_pairs(s) if braces is None else braces
                close = braces.get(j)
                if close is None:
                    raise ParseError("unbalanced braces")
                inner, i = s[j + 1:close], close + 1
            elif j < n:
                inner, i = s[j], j + 1
            else:
                raise ParseError(f"{text} without argument")
            inner = inner.strip()
            if text in ("\\text", "\\textbf", "\\textnormal", "\\mbox", "\\textrm", "\\textit",
                        "\\textsf", "\\texttt", "\\emph") or len(inner) != 1 or not inner.isalpha():
                if text == "\\operatorname":
                    out.append(("word", inner))
                else:
                    out.append(("text", inner))
            elif text == "\\mathrm" and inner == "e":
                out.append(("cmd", "\\e"))
            else:
                out.append(("word", inner))
        elif kind == "esc":
            mapped = _ESCAPES.get(text)
            if mapped is not None:
                out.append(("op", mapped))
        elif kind == "op" and text in _UNICODE_OPS:
            mapped = _UNICODE_OPS[text]
            out.append(("cmd" if mapped.startswith("\\") else "op", mapped))
        elif kind == "word" and len(text) == 1 and "\u0391" <= text <= "\u03c9":
            out.append(("cmd", "\\" + _greek_name(text)))
        else:
            out.append((kind, text))
        if len(out) > MAX_TOKENS:
            raise ParseError("too many tokens")
    return out


# ---------------------------------------------------------------------------------------------
# Parser

FUNCS = {"sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "asin", "acos",
         "atan", "sinh", "cosh", "tanh", "log", "ln", "exp", "sqrt", "abs", "Abs", "floor", "ceil",
         "ceiling", "factorial", "binomial", "lg"}
_FUNC_ALIASES = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "Abs": "abs", "ceil": "ceiling",
                 "lg": "log10"}
_CONST_WORDS = {"pi": ("const", "pi"), "oo": ("const", "oo"), "inf": ("const", "oo"),
                "infty": ("const", "oo"), "infinity": ("const", "oo")}
GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
          "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon",
          "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Sigma",
          "Phi", "Psi", "Omega", "ell"}
_REL_CMDS = {"\\le": "<=", "\\leq": "<=", "\\leqslant": "<=", "\\ge": ">=", "\\geq": ">=",
             "\\geqslant": ">=", "\\ne": "!=", "\\neq": "!=", "\\lt": "<", "\\gt": ">",
             "\\approx": "~", "\\in": "in", "\\equiv": "=", "\\sim": "~", "\\simeq": "~"}
_REL_OPS = {"=", "<", ">", "<=", ">=", "!="}
_MUL_CMDS = {"\\cdot", "\\times", "\\ast"}
_FUNC_CMDS = {"\\sin", "\\cos", "\\tan", "\\cot", "\\sec", "\\csc", "\\arcsin", "\\arccos",
              "\\arctan", "\\sinh", "\\cosh", "\\tanh", "\\log", "\\ln", "\\exp", "\\lg"}
_CALL_NAMES = {"f", "g", "h", "F", "G", "H", "P", "Q"}
_SEPARATOR_WORDS = {"and", "or", ",", "and/or"}
_REJECT_CMDS = {"end", "right", "left", "rfloor", "rceil", "rangle", "sum", "prod", "int", "lim", "cap",
                "setminus", "to", "rightarrow", "Rightarrow", "implies", "iff", "mid", "dots", "ldots",
                "cdots", "vdots", "ddots", "hline", "cline", "multicolumn", "label", "tag", "neq", "quad"}
_MATRIX_ENVS = {"matrix", "pmatrix", "bmatrix", "Bmatrix", "vmatrix", "Vmatrix", "smallmatrix", "array"}
_DECOR_CMDS = {"\\overline", "\\vec", "\\hat", "\\bar", "\\tilde", "\\overrightarrow", "\\widehat",
               "\\mathbf", "\\underline", "\\boxed", "\\fbox", "\\dot"}

_SIGN_BP = 25  # right binding power of a leading sign: between * / (20) and ^ (30)
_LBP = {"\\cup": 5, "pm": 10, "\\pm": 10, "\\mp": 10, "+": 10, "-": 10, ":": 8, "*": 20, "/": 20,
        "\\cdot": 20, "\\times": 20, "\\ast": 20, "\\div": 20, "^": 30, "**": 30, "!": 40, "%": 40,
        "'": 40}


def _num(text: str) -> tuple:
    if "." in text:
        whole, frac = text.split(".")
        ndec = len(frac)
        return ("num", Fraction(int(whole or "0") * 10 ** ndec + int(frac or "0"), 10 ** ndec),
                ndec if ndec else None)
    return ("num", Fraction(int(text)), None)


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], strict: bool = False):
        self.toks = tokens
        self.pos = 0
        self.depth = 0
        self.abs_depth = 0
        self.strict = strict  # plain arithmetic: juxtaposition multiplies only before "("

    # -- token helpers
    def peek(self, k: int = 0) -> tuple[str, str]:
        j = self.pos + k
        return self.toks[j] if j < len(self.toks) else ("eof", "")

    def next(self) -> tuple[str, str]:
        tok = self.peek()
        self.pos += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.next()
        if tok[1] != text:
            raise ParseError(f"expected {text!r}, got {tok[1]!r}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError("nesting too deep")

    # -- lists and relations
    def is_separator(self, tok: tuple[str, str]) -> bool:
        if tok[0] == "op" and tok[1] in (",", ";"):
            return True
        return tok[0] in ("text", "word") and tok[1].strip().lower() in _SEPARATOR_WORDS

    def parse_items(self, closers: tuple[str, ...]) -> list:
        items = []
        while True:
            while self.is_separator(self.peek()):
                self.next()
            if self.peek()[1] in closers or self.peek()[0] == "eof":
                return items
            items.append(self.parse_relation())
            if not self.is_separator(self.peek()):
                return items

    def rel_op(self) -> str | None:
        kind, text = self.peek()
        if kind == "op" and text in _REL_OPS:
            return text
        if kind == "cmd" and text in _REL_CMDS:
            return _REL_CMDS[text]
        return None

    def parse_relation(self) -> tuple:
        parts = [self.parse_expression(0)]
        ops = []
        while (op := self.rel_op()) is not None:
            self.next()
            ops.append(op)
            parts.append(self.parse_expression(0))
        return ("rel", tuple(parts), tuple(ops)) if ops else parts[0]

    # -- Pratt core
    def parse_expression(self, rbp: int) -> tuple:
        self.enter()
        left = self.nud(self.next())
        while True:
            tok = self.peek()
            lbp = self.lbp(tok)
            if lbp <= rbp:
                break
            left = self.led(left, tok, lbp)
        self.depth -= 1
        return left

    def starts_primary(self, tok: tuple[str, str]) -> bool:
        kind, text = tok
        if kind in ("num", "word"):
            return text.lower() not in _SEPARATOR_WORDS
        if kind == "text":
            return text.strip().lower() not in _SEPARATOR_WORDS
        if kind == "cmd":
            return text not in _REL_CMDS and text not in _MUL_CMDS and text[1:] not in _REJECT_CMDS \
                and text not in ("\\cup", "\\pm", "\\mp", "\\div")
        if kind == "op":
            return text in ("(", "\\{", "{") or (text == "|" and self.abs_depth == 0)
        return False

    def lbp(self, tok: tuple[str, str]) -> int:
        kind, text = tok
        if kind in ("op", "cmd") and text in _LBP:
            return _LBP[text]
        if self.starts_primary(tok) and (not self.strict or tok == ("op", "(")):
            return 20  # implicit multiplication
        return 0

    def led(self, left: tuple, tok: tuple[str, str], lbp: int) -> tuple:
        kind, text = tok
        if kind in ("op", "cmd") and text in _LBP:
            self.next()
            if text in ("+", "-"):
                return (text, left, self.parse_expression(lbp))
            if text in ("*", "\\cdot", "\\times", "\\ast"):
                return ("*", left, self.parse_expression(lbp))
            if text in ("/", "\\div"):
                return ("/", left, self.parse_expression(lbp))
            if text in ("^", "**"):
                return ("^", left, self.parse_exponent())
            if text == "!":
                return ("fact", left)
            if text == "%":
                return ("pct", left)
            if text == "'":
                if left[0] == "sym":
                    return ("sym", left[1] + "'")
                raise ParseError("stray prime")
            if text == "\\cup":
                return ("union", left, self.parse_expression(lbp))
            if text in ("pm", "\\pm", "\\mp"):
                return ("pm", left, self.parse_expression(lbp))
            if text == ":":
                return ("ratio", left, self.parse_expression(lbp))
        # implicit multiplication; an integer followed by a fraction of integers is a mixed number
        whole = left[1] if left[0] == "neg" else left  # -2\frac{1}{2} is -(2 + 1/2)
        mixed = tok == ("cmd", "\\frac") and whole[0] == "num" and whole[2] is None
        right = self.parse_expression(20)
        if mixed and right[0] == "/" and right[1][0] == "num" and right[2][0] == "num" \
                and right[1][2] is None and right[2][2] is None:
            return ("neg", ("+", whole, right)) if left[0] == "neg" else ("+", left, right)
        return ("*", left, right)

    def parse_exponent(self) -> tuple:
        if self.peek()[1] == "{":
            return self.parse_group()
        return self.parse_expression(29)

    def parse_group(self) -> tuple:
        """A LaTeX argument: {...} or a single digit / letter / command."""
        kind, text = self.peek()
        if text == "{":
            self.next()
            self.enter()
            items = self.parse_items(("}",))
            self.expect("}")
            self.depth -= 1
            if len(items) != 1:
                raise ParseError("group must hold one expression")
            return items[0]
        if kind == "num":
            self.next()
            if len(text) > 1 and "." not in text:
                self.toks.insert(self.pos, ("num", text[1:]))
                text = text[0]
            return _num(text)
        if kind == "word" and len(text) > 1 and text not in _CONST_WORDS and text not in FUNCS:
            self.next()
            self.toks.insert(self.pos, ("word", text[1:]))
            return ("sym", text[0])
        return self.nud(self.next())

    def parse_subscript(self) -> str:
        kind, text = self.next()
        if text == "{":
            depth, parts = 1, []
            while True:
                k, t = self.next()
                if k == "eof":
                    raise ParseError("unbalanced subscript")
                depth += (t == "{") - (t == "}")
                if depth == 0:
                    return "{" + "".join(parts) + "}"
                parts.append(t)
        if kind in ("num", "word"):
            return text
        raise ParseError("bad subscript")

    def parse_bracketed(self, opener: str) -> tuple:
        self.enter()
        closers = (")", "]") if opener in ("(", "[") else ("}",) if opener == "{" else ("\\}",)
        items = self.parse_items(closers)
        closer = self.next()[1]
        if closer not in closers:
            raise ParseError(f"unclosed {opener}")
        self.depth -= 1
        if opener == "\\{":
            return ("set", tuple(items))
        if opener == "{":
            if len(items) == 1:
                return items[0]
            return ("list", tuple(items))
        if len(items) == 1 and {opener, closer} in ({"(", ")"}, {"[", "]"}):
            return items[0]
        return ("seq", opener, closer, tuple(items))

    def parse_fn_arg(self) -> tuple:
        if self.peek()[1] == "(":
            self.next()
            return self.parse_bracketed("(")
        if self.peek()[1] == "{":
            return self.parse_group()
        return self.parse_expression(25)

    def parse_matrix(self, env: str) -> tuple:
        if env == "array" and self.peek()[1] == "{":
            self.parse_subscript()  # column spec, ignored
        rows, row = [], []
        while True:
            if self.peek()[1] == "\\end":
                self.next()
                self.parse_subscript()
                break
            if self.peek()[0] == "eof":
                raise ParseError("unterminated matrix")
            if self.peek()[0] == "rowsep":
                self.next()
                rows.append(tuple(row))
                row = []
                continue
            if self.peek()[1] == "&":
                self.next()
                continue
            row.append(self.parse_relation())
        if row:
            rows.append(tuple(row))
        rows = [r for r in rows if r]
        if not rows or len({len(r) for r in rows}) != 1:
            raise ParseError("ragged matrix")
        return ("matrix", tuple(rows))

    def nud(self, tok: tuple[str, str]) -> tuple:
        kind, text = tok
        if kind == "num":
            node = _num(text)
            if self.peek()[1] == "_":  # base subscript such as 204_5
                self.next()
                return ("sym", text + "_" + self.parse_subscript())
            return node
        if kind == "word":
            return self.nud_word(text)
        if kind == "text":
            return ("text", text)
        if kind == "cmd":
            return self.nud_cmd(text)
        if kind == "op":
            if text in ("(", "[", "{", "\\{"):
                return self.parse_bracketed(text)
            # a sign binds tighter than * / and looser than ^: 6 / -2 * 3 = (6 / -2) * 3, -3^2 = -(3^2)
            if text == "-":
                return ("neg", self.parse_expression(_SIGN_BP))
            if text == "+":
                return self.parse_expression(_SIGN_BP)
            if text == "pm":
                return ("pm", None, self.parse_expression(15))
            if text == "|":
                self.abs_depth += 1
                inner = self.parse_expression(0)
                self.abs_depth -= 1
                self.expect("|")
                return ("fn", "abs", (inner,))
        raise ParseError(f"unexpected {text!r}")

    def nud_word(self, text: str) -> tuple:
        if text in _CONST_WORDS:
            return _CONST_WORDS[text]
        if text in FUNCS:
            name = _FUNC_ALIASES.get(text, text)
            if self.peek()[1] == "(":
                self.next()
                arg = self.parse_bracketed("(")
                args = arg[3] if arg[0] == "seq" else (arg,)
                return ("fn", name, tuple(args))
            return ("fn", name, (self.parse_fn_arg(),))
        if len(text) > 1 and text.isascii():
            # a run of letters is a product of one-letter symbols (xy = x*y)
            self.toks.insert(self.pos, ("word", text[1:]))
            return self.nud_word(text[0])
        name = text
        if self.peek()[1] == "_":
            self.next()
            name = name + "_" + self.parse_subscript()
        if text in _CALL_NAMES and self.peek()[1] == "(":
            self.next()
            arg = self.parse_bracketed("(")
            args = arg[3] if arg[0] == "seq" else (arg,)
            return ("call", name, tuple(args))
        return ("sym", name)

    def nud_cmd(self, text: str) -> tuple:
        if text == "\\frac":
            return ("/", self.parse_group(), self.parse_group())
        if text in ("\\binom", "\\dbinom", "\\tbinom"):
            return ("fn", "binomial", (self.parse_group(), self.parse_group()))
        if text == "\\sqrt":
            if self.peek()[1] == "[":
                self.next()
                index = self.parse_expression(0)
                self.expect("]")
                return ("^", self.parse_group(), ("/", ("num", Fraction(1), None), index))
            return ("fn", "sqrt", (self.parse_group(),))
        if text in _FUNC_CMDS:
            name = _FUNC_ALIASES.get(text[1:], text[1:])
            power = None
            base = None
            if name == "log" and self.peek()[1] == "_":
                self.next()
                base = self.parse_group()
            if self.peek()[1] == "^":
                self.next()
                power = self.parse_exponent()
            node = ("fn", name, (self.parse_fn_arg(),) + ((base,) if base is not None else ()))
            return ("^", node, power) if power is not None else node
        if text == "\\pi":
            return ("const", "pi")
        if text == "\\e":
            return ("const", "E")
        if text == "\\infty":
            return ("const", "oo")
        if text in ("\\emptyset", "\\varnothing"):
            return ("set", ())
        if text in ("\\pm", "\\mp"):
            return ("pm", None, self.parse_expression(15))
        if text in ("\\lfloor", "\\lceil"):
            inner = self.parse_expression(0)
            self.expect("\\rfloor" if text == "\\lfloor" else "\\rceil")
            return ("fn", "floor" if text == "\\lfloor" else "ceiling", (inner,))
        if text in ("\\lbrace",):
            return self.parse_bracketed("\\{")
        if text in ("\\langle",):
            items = self.parse_items(("\\rangle",))
            self.expect("\\rangle")
            return ("seq", "(", ")", tuple(items))
        if text in _DECOR_CMDS:
            inner = self.parse_group()
            if text in ("\\boxed", "\\fbox", "\\mathbf"):
                return inner
            if inner[0] == "sym":
                return ("sym", text[1:] + "{" + inner[1] + "}")
            raise ParseError(f"{text} over a non-symbol")
        if text == "\\begin":
            env = self.parse_subscript().strip("{}").rstrip("*")
            if env in _MATRIX_ENVS:
                return self.parse_matrix(env)
            raise ParseError(f"environment {env} not supported")
        if text[1:] in GREEK:
            name = text[1:]
            if self.peek()[1] == "_":
                self.next()
                name = name + "_" + self.parse_subscript()
            return ("sym", name)
        if len(text) > 2 and text[1:] not in _REJECT_CMDS:
            return ("sym", text[1:])  # an unknown macro (\zzz) is an opaque name
        raise ParseError(f"unsupported command {text}")


def parse_answer(text: str) -> tuple:
    """Parses one (already extracted) answer string into a node tree; ParseError if it can't."""
    if not isinstance(text, str):
        raise ParseError("answer must be a string")
    if len(text) > MAX_CHARS:
        raise ParseError("answer too long")
    if deeper_than(text, MAX_DEPTH):
        raise ParseError("nesting too deep")
    s = normalize(text)
    if not s:
        raise ParseError("empty answer")
    groups = _split_top(s, ";")
    if len(groups) > 1 and all(len(_split_top(g, ",")) > 1 for g in groups):
        # "p=5,q=2;p=7,q=2": semicolons separate tuples whose members are separated by commas
        return ("list", tuple(("seq", "(", ")", tuple(_parse_items(g))) for g in groups))
    items = _parse_items(s)
    return items[0] if len(items) == 1 else ("list", tuple(items))


_ARITH_OPS = {"+", "-", "*", "/", "^", "**", "(", ")", "%"}


def parse_arithmetic(text: str) -> tuple:
    """Parses plain arithmetic (the step checker's claims) with the same grammar and trees as answers:
    numbers, + - * / ^ ** %, parentheses, and juxtaposition only before "(" (2(3+4)), so "3 4" or
    "1 000" is not a product. No normalisation; ParseError for anything else."""
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        raise ParseError("not an arithmetic string")
    tokens = tokenize(text)
    if not tokens or any(kind != "num" and not (kind == "op" and t in _ARITH_OPS) for kind, t in tokens):
        raise ParseError("not plain arithmetic")
    parser = _Parser(tokens, strict=True)
    node = parser.parse_expression(0)
    if parser.peek()[0] != "eof":
        raise ParseError(f"trailing input at {parser.peek()[1]!r}")
    return node


def _parse_items(s: str) -> list:
    parser = _Parser(tokenize(s))
    items = parser.parse_items(())
    if parser.peek()[0] != "eof":
        raise ParseError(f"trailing input at {parser.peek()[1]!r}")
    if not items:
        raise ParseError("empty answer")
    return items


def _split_top(s: str, sep: str) -> list[str]:
    """Splits at sep characters outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return [p for p in parts if p.strip()]
