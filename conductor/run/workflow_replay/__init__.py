"""Learning which workflow each question gets, on real model outputs (issue #47): the library side of
``bench/workflow_replay.py``.

- ``questions``: the question set (GSM8K test questions RouteLLM also recorded, MMLU-STEM; one content-hash
  order), its 50/20/30 split and the ``conductor answer`` spec that loads exactly these questions;
- ``recording``: the ``record`` stage (every menu entry over the live embedded pool, then the untrained default
  through ``conductor answer``), chunk by chunk, resumable;
- ``replay``: the ``replay`` stage (every entry, the default and the hybrid cascade from the recording alone, a
  menu conductor trained on replayed rollouts, the paired test);
- ``report``: the table and the plot.

The settings are typed (``RecordSettings``, ``ReplaySettings``); mistakes raise (``ReplaySettingsError``,
``ReplayError``), the bench turns them into one line and an exit code. Import the modules by path.
"""
