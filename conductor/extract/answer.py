"""Pull the final answer out of a free-form model response.

Models end answers in many ways: ``<answer>..</answer>`` tags (what our prompts
ask for), ``\\boxed{..}``, "The answer is ..", "#### ..", a committed final sentence
("So, there are 192 cows in 8 of the stalls.": ``final_sentence``, issue #47), or just a last number.
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


# ---------------------------------------------------------------- the committed final sentence (issue #47)

UNCOMMITTED = "[no committed answer]"   # the final sentence commits to an expression or hedges between two numbers
_CALC_RE = re.compile(r"<<[^<>\n]{0,200}>>")          # GSM8K calculator annotations: "$<<30*2.5=75>>75"
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])[*_)\]\s]*\s+(?=\S)|\n+")
_CLAUSE_RE = re.compile(r";\s|:\s|,\s*(?:so|thus|therefore|hence|which is|which means|that means|meaning)\s",
                        re.IGNORECASE)
_EQUALS_RE = re.compile(r"=|≈|\\approx")
_AFTER_EQUALS_RE = re.compile(r"\s*(?:\\?\$\s*)?(-?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?)"
                              r"(?:\s*(?:\\?%|\\?\)|\*\*))?(\s*[-+*/×÷^(]\s*[\w($\\])?")
_INTRO_RE = re.compile(r"^(?:in|after|for|over|with|since|because|at|by|within|including|adding|to|on|"
                       r"from|based|given|during|now|then|once|as)\b", re.IGNORECASE)
_WORD_NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_WORD_NUMBERS.update({"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
                      "hundred": 100, "a dozen": 12, "dozen": 12})
_WORD_NUMBER_RE = re.compile(r"\b(" + "|".join(sorted(_WORD_NUMBERS, key=len, reverse=True)) + r")\b", re.IGNORECASE)
# "is 72 cubic inches", "will be $220", "is now on the 18th": a value stated right after the verb
_COPULA_RE = re.compile(r"\s(?:is|are|was|were|will be|would be|comes to|equals)\s+(?:(?:about|approximately|roughly|"
                        r"only|still|now|exactly|just|a total of|on the|the)\s+)*(?=\\?\$?-?\d)", re.IGNORECASE)
_CLOCK_RE = re.compile(r"(?<![\w.:])(\d{1,2}):([0-5]\d)\s*(?:[ap]\.?m\b\.?)", re.IGNORECASE)
_HEDGE_RE = re.compile(r"(?<![\d,.])(\d[\d,]*(?:\.\d+)?)\s*%?\s*(?:[a-zA-Z]+\s+)?or\s+(?:about\s+|approximately\s+|maybe\s+)?"
                       r"\$?(\d[\d,]*(?:\.\d+)?)(?!\s*%)")


def _canonical(numeral: str) -> str:
    """``1,200.50`` -> ``1200.5``, ``18.00`` -> ``18``: one spelling per value, to compare echoes."""
    n = numeral.replace(",", "").replace(" ", "")
    return n.rstrip("0").rstrip(".") if "." in n and "/" not in n else n


def question_numbers(question: str | None) -> frozenset[str]:
    """The numbers a question states, digits and words (an ``<answer>42</answer>`` format example left out).

    >>> sorted(question_numbers("Three boxes hold 1,200.50 g each. Give it as <answer>42</answer>."))
    ['1200.5', '3']
    """
    if not question:
        return frozenset()
    text = re.sub(r"<answer>[^<]*</answer>", " ", question[:MAX_CHARS])
    found = {_canonical(n) for n in _NUMBER_RE.findall(text)}
    found |= {str(_WORD_NUMBERS[w.lower()]) for w in _WORD_NUMBER_RE.findall(text)}
    return frozenset(found)


def _after_equals(clause: str) -> str | None:
    """The value after the clause's last ``=`` (``≈``, ``\\approx``); ``""`` when it is an expression."""
    eq = list(_EQUALS_RE.finditer(clause))
    m = _AFTER_EQUALS_RE.match(clause, eq[-1].end()) if eq else None
    if not m:
        return None
    return "" if m.group(2) else m.group(1).replace(" ", "").replace(",", "")


def _numbers_in(text: str, words: bool = True) -> list[str]:
    """The numerals of ``text`` (commas removed); when it has none, its number words as numerals."""
    found = [n.replace(",", "") for n in _NUMBER_RE.findall(text)]
    return found or ([str(_WORD_NUMBERS[w.lower()]) for w in _WORD_NUMBER_RE.findall(text)] if words else [])


def _drop_openers(clause: str) -> str:
    """Drop leading comma-separated phrases that hold no number ("So,", "Therefore,") or open the sentence
    with a setting ("In 30 days,", "After 2 years,"), while what follows still states a number."""
    words = not _NUMBER_RE.search(clause)     # number words count only in a clause without numerals
    for _ in range(4):                        # a few openers at most: each pass rescans the rest
        parts = re.split(r",\s", clause, maxsplit=1)
        if len(parts) < 2 or not _numbers_in(parts[1], words):
            return clause
        head = parts[0].strip(" *_\"'")
        if _numbers_in(head, words) and not _INTRO_RE.match(head):
            return clause
        clause = parts[1]
    return clause


def committed_number(sentence: str, question: str | None = None) -> str | None:
    """The number a final sentence commits to: the one after its last ``=`` (``≈``), else what its last
    "is" / "are" / "will be" says the subject is, else its subject number: the first one past an opening
    phrase ("In 30 days,"); numbers that restate the ``question`` are passed over when another one is
    stated; else a number word; a clock time ("2:00 pm") is its hour. ``""``
    (a refusal) when what it commits to is an expression ("= 160 - y") or a hedge between two numbers.

    >>> committed_number("Adding these up, he needs 400 + 800 + 200 = 1400 bananas to last for 2 months.")
    '1400'
    >>> committed_number("So, there are 192 cows in 8 of the stalls."), committed_number("In 30 days, she drinks 15 gallons.")
    ('192', '15')
    >>> committed_number("The 42 kg bag will last 3 weeks.", "A 42 kg bag; she eats 2 kg a day. How many weeks?")
    '3'
    >>> committed_number("So $0.10 per pump is 10 cents per pump."), committed_number("All 3 boxes hold 72 cubic inches.")
    ('10', '3')
    >>> committed_number("So, 8 pieces would be used in a 32-page paper."), committed_number("It would be more than $10.")
    ('8', '10')
    >>> committed_number("He must deliver 160 - (roses delivered) = 160 - y roses."), committed_number("It is 8 or 9 days.")
    ('', '')
    >>> committed_number("To serve it at 5:00 pm, start at 2:00 pm."), committed_number("If he misses 4, he pays $10.")
    ('2', '4')
    >>> committed_number("Since there are two children, each child can have one bowl.", "their two children")
    '1'
    >>> committed_number("Therefore, when there are 10 guests, the two venues cost the same.")
    '10'
    >>> committed_number("So 1/4 or 25% of them."), committed_number("Each of them got one."), committed_number("Done!") is None
    ('1/4', '1', True)
    """
    clauses = [c for c in _CLAUSE_RE.split(sentence) if _NUMBER_RE.search(c)]
    clause = clauses[-1] if clauses else sentence
    after = _after_equals(clause)
    if after is not None:
        return after
    for a, b in _HEDGE_RE.findall(clause):
        if a.replace(",", "") != b.replace(",", "") and "%" not in clause:
            return ""
    clock = _CLOCK_RE.findall(clause)
    if clock:                              # "... to serve at 5:00 pm is 2:00 pm": the last time, its hour when on it
        hour, minute = clock[-1]
        return hour if minute == "00" else f"{hour}:{minute}"
    clause = _drop_openers(clause)
    copulas = list(_COPULA_RE.finditer(clause))
    tail = clause[copulas[-1].end():] if copulas else ""    # "so $0.10 per pump is 10 cents": what it *is*
    numbers = _numbers_in(tail if _NUMBER_RE.search(tail) else clause)
    echoes = question_numbers(question)
    fresh = [n for n in numbers if _canonical(n) not in echoes]
    pick = fresh or numbers
    return pick[0] if pick else None


def final_sentence(text: str, question: str | None = None) -> str | None:
    """The number committed to by the last sentence that states one (calculator annotations ``<<..>>``
    dropped): how a teacher reads a prose reply whose answer is not its last number. ``UNCOMMITTED`` when
    that sentence commits to an expression or hedges ("8 or 9 days"): no later rule may pick a number out of
    it. ``question`` (optional) tells restated numbers from the answer (``committed_number``).

    >>> final_sentence("He has 24 cows per stall, so 24 * 8 = 192.\\n\\nSo, there are 192 cows in 8 of the stalls.")
    '192'
    >>> final_sentence("Andy needs a daily calorie deficit of 525 calories to reach his goal by July 19th.")
    '525'
    >>> final_sentence("Bill is now on the 18th floor."), final_sentence("He pays $<<30*2.5=75>>75 in all.")
    ('18', '75')
    >>> final_sentence("Total = $1,040,000.\\nSo the total is 3.5 million? No: $1,040,000 * 3 = $3,120,000.")
    '3120000'
    >>> final_sentence("It costs 12 dollars.\\nI hope this helps!"), final_sentence("no numbers here") is None
    ('12', True)
    >>> final_sentence("So it takes 8 or 9 days.")
    '[no committed answer]'

    """
    text = _CALC_RE.sub("", _tail(text))
    pieces = _SENTENCE_END_RE.split(text)
    for sentence in reversed(pieces[-200:]):      # a reply's answer is in its last sentences
        if _NUMBER_RE.search(sentence) or _WORD_NUMBER_RE.search(sentence):
            found = committed_number(sentence, question)
            return UNCOMMITTED if found == "" else found
    return None


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
    "sentence": final_sentence,
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
            deadline_s: float = DEADLINE_S, question: str | None = None) -> str | None:
    """Apply ``rules`` in order to the last ``MAX_CHARS`` characters of ``text``; give up (None)
    once ``deadline_s`` has passed. ``question`` is read by the ``sentence`` rule only.

    >>> extract("thinking... <answer>The answer is \\\\boxed{7}</answer>")
    '7'
    >>> extract("<answer>The final answer is 7.</answer>")
    '7'
    >>> extract("I think it's 12 apples.")
    '12'
    >>> extract("I think it's 12 apples.", ["tag", "boxed"]) is None
    True
    >>> extract("So, 5 springs make 72000 jellyfish in 4 hours.", ["sentence"], question="5 springs, 4 hours?")
    '72000'
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
        found = final_sentence(text, question) if name == "sentence" else rule(text)
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
    "numeric": ("tag", "boxed", "final_line", "sentence", "last_number"),
    "mcq": ("tag", "boxed", "final_line"),
    "code": ("code",),
    "free": ("tag", "boxed", "final_line"),
}
