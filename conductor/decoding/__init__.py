"""The decoding contract: what a conductor completion may look like, and how decoding is held to it.

One home for what used to be split over the grammar module, the GRPO format file and the transformers
backend:

- ``grammar``: ``WorkflowGrammar``, the GBNF every policy backend decodes under, built for an explicit number
  of workers (the sub-pool the prompt lists), and the rule for what a free-text subtask may contain;
- ``subtasks``: the subtask vocabulary a small conductor chooses from (``direct``, ``code``, ``check``, ...);
- ``contract``: ``ConductorFormat``, a checkpoint's decoding contract (``conductor_format.json``);
- ``vocabulary``: a model's vocabulary as llguidance sees it, its end tokens, and which completion tokens
  the grammar left a choice at;
- ``mask``: grammar masks for a whole batch, computed in parallel and applied on the model's device.

Nothing here imports torch or llguidance at import time.
"""
