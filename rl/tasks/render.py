"""Rendering problems as model text: the prompt and the gold solution, in Chinese or English.

The format is the team contract's (and what `rewards.parse` reads):
    prompt   zh "问题：{question}\\n解答：\\n"          en "Question: {question}\\nSolution:\\n"
    solution zh "步骤一：...\\n步骤二：...\\n答案：{answer}"  en "Step 1: ...\\nStep 2: ...\\nAnswer: {answer}"
Step numbers are Chinese numerals in zh (一 … 十, 十一, 二十三, 一百零一). The answer line is always the last
line and nothing follows it (the model emits EOS right after). A problem without gold steps renders as the
answer line alone.

The other task families render from their payload (`Problem.check`), so one problem reads in either language:
    code          prompt   the payload's statement in `lang` (signature, two examples, the ```python request)
                  solution 步骤一：{plan}\n步骤二：写出函数：\n```python\n{gold source}```\n答案：{function name}
                           (en: Step 1: {plan} / Step 2: Write the function: / Answer: {name}); without a plan
                           the code is step one. The answer line names the function, so the layout keeps
                           format_reward's steps-then-answer shape; rewards.code_reward reads the code block.
    instructions  prompt   the payload's task and constraint sentences in `lang`
                  solution the gold response (`answer`), in the language its constraints require
    gym           as math: the generator's question (English whatever `lang`), the answer line alone (no steps)

Chat checkpoints (model.hf_path with a chat template) get the prompt as one user turn instead,
`render_user_message(p, lang)`: the question followed by an instruction asking for this layout, e.g.
    en "{question}\nSolve it step by step: write each step as 'Step 1: ...', 'Step 2: ...', and end with a last line
        'Answer: <final answer>'."
The other families' statements already say what to write, so their user turn is the statement alone. The
solution (the SFT target, after the template's assistant header) is the same text as above.

Used by the SFT / rejection-sampling stages (prompt + solution as the training target) and by the samplers
(prompt only). A run's text in its tokenizer and prompt format is `prompt_text(cfg, tok, problem)` (the chat
template of a checkpoint, a system turn, else render_prompt) and `solution_text(tok, problem, lang)` (a tool-use
solution's output blocks in the tokenizer's markers); the run context (RunContext.prompt / .solution) and the
length checks of rl/setup.py call them.
"""
from __future__ import annotations

from rewards import python_tool
from rl.tasks.base import Problem

LANGS = ("zh", "en")
_OWN_QUESTION = ("math", "gym")  # families whose question is Problem.question (the others render their payload)
_CN_DIGITS = "零一二三四五六七八九"


def int_to_cn(n: int) -> str:
    """Chinese numeral for 1 <= n <= 9999 in the usual reading form: 10 -> 十, 12 -> 十二, 20 -> 二十,
    105 -> 一百零五, 1010 -> 一千零一十."""
    if not isinstance(n, int) or not 1 <= n <= 9999:
        raise ValueError(f"step number must be an int in [1, 9999], got {n!r}")
    if 10 <= n < 20:
        return "十" + (_CN_DIGITS[n % 10] if n % 10 else "")
    out, zero_pending = [], False
    for unit_value, unit in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
        d = (n // unit_value) % 10
        if d == 0:
            zero_pending = bool(out)
            continue
        if zero_pending:
            out.append("零")
            zero_pending = False
        out.append(_CN_DIGITS[d] + unit)
    return "".join(out)


def _check_lang(lang: str) -> str:
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    return lang


def render_prompt(problem: Problem, lang: str = "zh") -> str:
    """The prompt the model continues with its solution."""
    question = (problem.question if problem.reward in _OWN_QUESTION
                else problem.check_data["prompt"][_check_lang(lang)])
    if _check_lang(lang) == "zh":
        return f"问题：{question}\n解答：\n"
    return f"Question: {question}\nSolution:\n"


_INSTRUCTION = {
    "zh": "请逐步解答：每一步写成“步骤一：……”“步骤二：……”，最后一行写“答案：<最终答案>”。",
    "en": "Solve it step by step: write each step as 'Step 1: ...', 'Step 2: ...', and end with a last line "
          "'Answer: <final answer>'.",
}


# A system turn for chat models (model.system_prompt): the layout asked of the answer, the question then being the
# user turn alone (prompt_text). Used by `experiments.eval --model` and the pretrained recipes.
ANSWER_LINE_SYSTEM_PROMPT = ("You are a careful math assistant. Solve the problem step by step, one short step per "
                             "line, then give the final answer on a last line of the form 'Answer: <number>'.")


def render_user_message(problem: Problem, lang: str = "zh") -> str:
    """The user turn for a chat template: the question and the layout instruction (the statement alone for the
    code and instruction families, whose statements carry their own)."""
    if problem.reward not in _OWN_QUESTION:
        return problem.check_data["prompt"][_check_lang(lang)]
    return f"{problem.question}\n{_INSTRUCTION[_check_lang(lang)]}"


def step_marker(i: int, lang: str = "zh") -> str:
    """The marker that opens step i (1-based): 步骤一： / Step 1: ."""
    return f"步骤{int_to_cn(i)}：" if _check_lang(lang) == "zh" else f"Step {i}: "


def answer_marker(lang: str = "zh") -> str:
    return "答案：" if _check_lang(lang) == "zh" else "Answer: "


def render_steps(steps, answer: str, lang: str = "zh") -> str:
    """Solution text from a list of step contents and an answer string."""
    _check_lang(lang)
    lines = [step_marker(i, lang) + s for i, s in enumerate(steps or (), start=1)]
    lines.append(answer_marker(lang) + answer)
    return "\n".join(lines)


def render_code_solution(problem: Problem, lang: str = "zh") -> str:
    """The gold solution of a code problem: the plan, the gold source in a ```python block, the answer line."""
    data = problem.check_data
    block = "```python\n" + problem.answer.rstrip("\n") + "\n```"
    write = ("写出函数：\n" if _check_lang(lang) == "zh" else "Write the function:\n") + block
    steps = [data["plan"][lang], write] if data.get("plan") else [write]
    return render_steps(steps, data["func"], lang)


def render_solution(problem: Problem, lang: str = "zh") -> str:
    """The gold solution: numbered steps, then the answer line last (see the module docstring for the code
    and instruction families)."""
    if problem.reward == "code":
        return render_code_solution(problem, lang)
    if problem.reward == "instructions":
        _check_lang(lang)
        return problem.answer
    return render_steps(problem.steps, problem.answer, lang)


def render_example(problem: Problem, lang: str = "zh") -> tuple[str, str]:
    """(prompt, gold solution): the SFT pair; the trainer appends EOS after the solution."""
    return render_prompt(problem, lang), render_solution(problem, lang)


# ------------------------------------------------------------------------------------------ a run's text
def prompt_text(cfg, tok, problem: Problem) -> str:
    """The prompt text the sampler continues: one user turn through the chat template (a checkpoint with
    model.chat_template), after a system turn when model.system_prompt is set (the user turn is then the bare
    question of a math problem; code and instruction problems keep their own statement), else render_prompt.
    `cfg`: the run's RunConfig (rl.config_validation, which imports rl.tasks: not imported here)."""
    lang = cfg.tasks.lang
    if cfg.model.checkpoint_field and cfg.model.chat_template:
        system = cfg.model.system_prompt
        if not system:
            return tok.render_chat_template([{"role": "user", "content": render_user_message(problem, lang)}])
        user = problem.question if problem.reward == "math" else render_user_message(problem, lang)
        return tok.render_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user}])
    return render_prompt(problem, lang)


def solution_text(tok, problem: Problem, lang: str) -> str:
    """The demonstration an SFT stage trains on: the worked solution, a tool-use solution's output blocks in the
    tokenizer's markers (rewards.python_tool.demonstration: a chat model's tool turn)."""
    return python_tool.demonstration(tok, render_solution(problem, lang))
