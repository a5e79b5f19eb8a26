"""One run end to end: its typed configuration, the pipeline's stages (plain functions that tasks wrap
one to one), the live side of a run (servers, policy, executor), preflight checks, progress,
summary, comparisons.
"""
