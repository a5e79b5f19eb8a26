"""Pull the final answer out of a free-form model response.

Models end answers in many ways: ``<answer>..</answer>`` tags (what our prompts
ask for), ``\\boxed{..}``, "The answer is ..", "#### ..", or just a last number.
Each rule is a small pure function returning ``None`` when it does not apply;
``extract`` tries the rules of a per-dataset ``Extraction`` config in order.

Replies can be huge and hostile (a degenerate worker repeating ``<answer>`` 100,000 times), so
every rule runs in time linear in its input, only the last ``MAX_CHARS`` characters of a reply
are read, and ``extract`` stops trying rules once ``DEADLINE_S`` has passed.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_CHARS = 200_000     # a reply is judged on its last MAX_CHARS characters (the answer comes last)
DEADLINE_S = 2.0        # extract() tries no further rule after this long (a backstop: rules are linear)

_OPEN_TAG_RE = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_TAG_RE = re.compile(r"</answer>", re.IGNORECASE)
# one token per brace, escaped pair or box opener: boxed() matches braces in a single pass
_BRACE_TOKEN_RE = re.compile(r"(\\(?:boxed|fbox)\s*\{)|\\.|[{}]", re.DOTALL)
_BOX_SPACE_RE = re.compile(r"\\boxed +([^\s$]+)")
_FINAL_RE = re.compile(
    r"(?:final\s+answer\s*(?:is)?\s*[:：]?|the\s+(?:correct\s+)?answer\s+is\s*[:：]?|answer\s*[:：]|####)\s*(.*)",
    re.IGNORECASE)
_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|(?<![\w.])-?\.\d+")
_CODE_START_RE = re.compile(r"^(?:def |class |import |from \S+ import |async def |@)", re.MULTILINE)
_FENCE_LANG_RE = re.compile(r"[ \t]*([\w+-]*)")
_SPACES_RE = re.compile(r"\s+")
_LETTER_PATTERNS = (
    r"(?:answer|option|choice)\s*(?:is|:)?\s*(?:option\s*)?\(?\**([A-{last}])\**\)?(?![\w])",
    # markdown or LaTeX emphasis around a lone letter: "is to **B**.", "__C__", "*D*", "**(B)**", "\textbf{A}"
    r"(?:\*\*|__)\s*\(?([A-{last}])[.):]?\s*(?:\*\*|__)(?![\w*])",
    r"(?<![\w*])\*\(?([A-{last}])[.)]?\*(?![\w*])",
    r"(?:\*\*|__)\s*\(?([A-{last}])[.):]\s",
    r"\\text(?:bf)?\{{\s*\(?([A-{last}])\)?\s*\}}",
    r"^\s*\(?\**([A-{last}])\**\)?\s*(?:[.):]|$)",
    r"\(([A-{last}])\)",
    r"(?<![\w'])([A-{last}])(?![\w'])",
)


_LONG_GAP = re.compile(r"\s{64,}")


def _tail(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[-MAX_CHARS:]


def answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>`` that is closed, up to the first ``</answer>`` after it.

    >>> answer_tag("<idea>x</idea><answer> 42 </answer>")
    '42'
    >>> answer_tag("<answer>draft <answer>7</answer> <answer>unclosed")
    '7'
    >>> answer_tag("no tags") is None
    True
    """
    text = _tail(text)
    closes = [m.start() for m in _CLOSE_TAG_RE.finditer(text)]
    if not closes:
        return None
    for start in reversed([m.end() for m in _OPEN_TAG_RE.finditer(text)]):
        k = bisect.bisect_left(closes, start)
        if k < len(closes):
            return text[start:closes[k]].strip()
    return None


def boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed).

    >>> boxed(r"so $\\boxed{\\frac{1}{2}}$ and")
    '\\\\frac{1}{2}'
    >>> boxed(r"\\boxed{a} then \\boxed{\\{1,2\\}}")
    '\\\\{1,2\\\\}'
    >>> boxed(r"\\boxed{unclosed") is None
    True
    """
    text = _tail(text)
    stack: list[int] = []             # where each open brace's content starts; -1 for a plain brace
    span = (-1, -1)                   # the closed box that opened last
    for m in _BRACE_TOKEN_RE.finditer(text):
        if m.group(1):
            stack.append(m.end())
        elif m.group() == "{":
            stack.append(-1)
        elif m.group() == "}" and stack:
            start = stack.pop()
            if start > span[0]:
                span = (start, m.start())
    last = text[span[0]:span[1]].strip() if span[0] >= 0 else None
    if last is None:
        spaced = _BOX_SPACE_RE.findall(text)
        last = spaced[-1] if spaced else None
    return last


def _strip_chars(s: str, lead: str, trail: str) -> str:
    """Strip whitespace plus ``lead`` chars from the front and ``trail`` chars from the back (linear;
    a regex like ``[\\s*.]+$`` is quadratic on a long run that is not at the end)."""
    i, j = 0, len(s)
    while i < j and (s[i].isspace() or s[i] in lead):
        i += 1
    while j > i and (s[j - 1].isspace() or s[j - 1] in trail):
        j -= 1
    return s[i:j]


def _clean_line(s: str) -> str:
    s = _strip_chars(s, "*", "*.")
    s = s.strip("$").strip()
    s = s.removeprefix("\\(").removesuffix("\\)").strip()
    return s.rstrip(".").strip()


def final_answer_line(text: str) -> str | None:
    """The rest of the line after the last "The answer is", "Final answer:", "Answer:" or "####".

    >>> final_answer_line("work...\\n#### 1,234")
    '1,234'
    >>> final_answer_line("So the final answer is: $x^2$.")
    'x^2'
    >>> final_answer_line("nothing here") is None
    True

    A phrase that ends its line ("The final answer is:") takes the next non-empty line:

    >>> final_answer_line("The final answer is:\\n\\n**D**\\nbecause ...")
    'D'
    >>> final_answer_line("the final answer is:\\n") is None
    True
    """
    best: str | None = None
    pending = False                   # the last phrase ended its line: the answer is on the next one
    for line in _tail(text).splitlines():
        if pending and line.strip():
            pending = False
            cand = _clean_line(line.strip().lstrip(":："))
            if cand:
                best = cand
        for m in _FINAL_RE.finditer(line):
            cand = _clean_line(m.group(1).lstrip(":："))
            if cand:
                best, pending = cand, False
            else:
                pending = True
    return best


def last_number(text: str) -> str | None:
    """The last number in the text, thousands separators removed.

    >>> last_number("Costs $1,200.50 then 7 more, so 3/4")
    '3/4'
    >>> last_number("it is -5.")
    '-5'
    >>> last_number("none") is None
    True
    """
    found = _NUMBER_RE.findall(_tail(text))
    return found[-1].replace(",", "") if found else None


def choice_letter(text: str, n_choices: int = 4, choices: Sequence[str] | None = None) -> str | None:
    """A choice letter (A..) from phrases like "answer is (B)", "B.", or a bare letter;
    falls back to matching an option's text.

    >>> choice_letter("The answer is (C).")
    'C'
    >>> choice_letter("b")
    'B'
    >>> choice_letter("I pick Paris", 3, ["London", "Paris", "Rome"])
    'B'
    >>> choice_letter("maybe", 4) is None
    True
    """
    if n_choices < 1:
        return None
    # one space (or one newline) per whitespace run: the patterns' \\s* then stay short
    text = _SPACES_RE.sub(lambda m: "\n" if "\n" in m.group() else " ", _tail(text))
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    last = letters[min(n_choices, 26) - 1]
    stripped = text.strip().strip("*$ ").rstrip(".").strip()
    bare = stripped.strip("()[]* ")
    if len(bare) == 1 and bare.isalpha() and bare.upper() <= last:
        return bare.upper()
    opts = [" ".join(str(c).lower().split()).rstrip(".") for c in choices] if choices else []
    flat = " ".join(stripped.lower().split())
    raw = " ".join(text.strip().split()).rstrip(".")
    exact = [" ".join(str(c).split()).rstrip(".") for c in choices] if choices else []
    for cand, pool in ((raw, exact), (stripped, exact), (raw.lower(), opts), (flat, opts)):
        if cand in pool and pool.count(cand) == 1:   # the answer is exactly one option's text
            return letters[pool.index(cand)]
    # nothing but two or more option letters ("A or B", "B/C", "(A), (C)") is a hedge, not a choice
    one = rf"\(?[A-{last}]\)?"
    if re.fullmatch(rf"{one}(?:\s*(?:,|/|\bor\b|\band\b)\s*{one})+", stripped, flags=re.IGNORECASE) and \
            len(set(re.findall(rf"[A-{last}]", stripped.upper().replace("OR", "").replace("AND", "")))) > 1:
        return None
    for k, pattern in enumerate(_LETTER_PATTERNS):
        if k == len(_LETTER_PATTERNS) - 1 and len(stripped.split()) > 3:
            break                         # a bare capital inside a sentence is not a choice
        found = re.findall(pattern.format(last=last), text, flags=re.MULTILINE)
        if found:
            return found[-1].upper()
    if opts:
        low = flat
        hits = [(low.rfind(o), i) for i, o in enumerate(opts) if o]
        hits = [(pos, i) for pos, i in hits if pos >= 0]
        if hits:
            # prefer the option that ends last; among ties the longest text
            pos, i = max(hits, key=lambda h: (h[0] + len(opts[h[1]]), len(opts[h[1]])))
            return letters[i]
    return None


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block, in one left-to-right pass: a fence opens a block,
    its line ends the header, and the next fence after that line closes it."""
    out: list[tuple[str, str]] = []
    pos = text.find("```")
    while pos >= 0:
        newline = text.find("\n", pos + 3)
        if newline < 0:
            break
        close = text.find("```", newline + 1)
        if close < 0:
            break
        lang = _FENCE_LANG_RE.match(text, pos + 3, newline)
        out.append((lang.group(1) if lang else "", text[newline + 1:close]))
        pos = text.find("```", close + 3)
    return out


def code_block(text: str) -> str | None:
    """The last fenced code block (python preferred). Without a fence: the content of an
    ``<answer>`` tag if any, else the text from the first line that starts like code.

    >>> code_block("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    'def f():\\n    return 1\\n'
    >>> code_block("def g(): pass")
    'def g(): pass'
    >>> code_block("Sure, here it is:\\nimport math\\ndef g(): pass")
    'import math\\ndef g(): pass'
    """
    text = _tail(text)
    blocks = _fenced_blocks(text)
    if blocks:
        py = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
        return (py or [code for _, code in blocks])[-1]
    tagged = answer_tag(text)
    if tagged:
        text = tagged
    m = _CODE_START_RE.search(text)
    if m and m.start() > 0:
        return text[m.start():]
    return text if text.strip() else None


Rule = Callable[[str], "str | None"]
RULES: dict[str, Rule] = {
    "tag": answer_tag,
    "boxed": boxed,
    "final_line": final_answer_line,
    "last_number": last_number,
    "code": code_block,
}


@dataclass(frozen=True)
class Extraction:
    """Ordered rules for one dataset; the first rule that finds something wins.
    A tag whose content holds a ``\\boxed{}`` or a final-answer phrase yields that part."""

    rules: tuple[str, ...] = ("tag", "boxed", "final_line", "last_number")

    def __call__(self, text: str | None) -> str | None:
        return extract(text, self.rules)


def extract(text: str | None, rules: Sequence[str] = ("tag", "boxed", "final_line", "last_number"),
            deadline_s: float = DEADLINE_S) -> str | None:
    """Apply ``rules`` in order to the last ``MAX_CHARS`` characters of ``text``; give up (None)
    once ``deadline_s`` has passed.

    >>> extract("thinking... <answer>The answer is \\\\boxed{7}</answer>")
    '7'
    >>> extract("<answer>The final answer is 7.</answer>")
    '7'
    >>> extract("I think it's 12 apples.")
    '12'
    >>> extract("I think it's 12 apples.", ["tag", "boxed"]) is None
    True
    """
    if not text:
        return None
    text = _tail(text)
    stop = time.monotonic() + deadline_s
    for name in rules:
        if time.monotonic() > stop:
            return None       # a backstop only: every rule is linear in the (capped) text
        try:
            rule = RULES[name]
        except KeyError:
            raise ValueError(f"unknown extraction rule {name!r}; known: {', '.join(RULES)}") from None
        found = rule(text)
        if found and name != "code":   # a long run of blanks ends an answer ("12" + 160,000 blanks + "x")
            found = _LONG_GAP.split(found, 1)[0].strip()
        if found is not None and found != "":
            if name == "tag":     # "<answer>The answer is \boxed{5}</answer>" -> "5"
                inner = boxed(found) or final_answer_line(found)
                if inner:
                    return inner
            return found
    return None


# Per-kind defaults (datasets may override through Question.metadata["extract"]).
DEFAULT_RULES: dict[str, tuple[str, ...]] = {
    "math": ("tag", "boxed", "final_line", "last_number"),
    "numeric": ("tag", "boxed", "final_line", "last_number"),
    "mcq": ("tag", "boxed", "final_line"),
    "code": ("code",),
    "free": ("tag", "boxed", "final_line"),
}
