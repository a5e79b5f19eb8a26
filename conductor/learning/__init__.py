"""Learning from the lake: GRPO training (``grpo/``), evaluation statistics, the checkpoint
registry (champion, challenger), and the nightly run's decisions and report.
"""
