"""Reading a model's reply: the final answer (``answer.py``: tags, ``\\boxed{}``, "the answer is", the committed
final sentence, a choice letter, a code block) and the numbers in it (``numbers.py``: exact values, tolerance).

A shared leaf: it imports nothing of the project, so the graders (``grading/``), the ``vote`` and ``agree`` tool
workers and the fault wrappers (``workers/``) all read replies the same way.
"""
