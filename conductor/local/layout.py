"""How a run's embedded models share this machine's cores: side by side on a share each, or one at a time on all.

WHY two layouts. llama.cpp's threads spin while they wait for each other, so engines whose threads add up to more
than the cores slow each other several-fold: with the 1.5B and the 0.5B servers on 2 threads each of 2 cores, the
0.5B's 10-token reports took 25-70 s instead of ~3 (docs/figures/answer-flow/2026-11-30-menu-threads2-partial.log).
So a run either

- ``parallel``: gives every engine all cores but one and lets them compute at once. The writing conductor needs
  this: it drafts the next question's ~70-token workflow while the workers execute this one
  (conductor/run/overlap.py), and a chain's 1.5B and 0.5B steps of neighbouring questions overlap; or
- ``serial``: gives every engine the cores that are free when the run starts (all of them on an idle machine;
  ``free_cores``: another job's busy core is left to it, since a thread on it would spin against that job, 44 s
  against 6 in docs/backends.md) and lets one compute at a time. The embedded workers share one
  concurrency slot (``SERIAL_SLOT``: ``Limits.share``), and the conductor decides only between executions
  (``overlaps_execution`` in conductor/run/overlap.py). Faster wherever the conductor has little or nothing to
  write (a menu's one-line choice, a fixed strategy): the 1.5B alone answers 1.67x faster on 2 threads than on 1
  (23.4 against 39.2 s/question, docs/figures/answer-flow/2026-11-29-fair.log), and a chain's report is a tenth
  of its reasoning, so running them one after the other on both cores beats overlapping them on one each.

``$CONDUCTOR_LOCAL_THREADS`` overrides the thread count in either layout (conductor/local/process.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from conductor.local.process import THREADS_ENV, default_threads

SERIAL_SLOT = "embedded-cores"   # the one concurrency slot the embedded workers share in the serial layout


@dataclass(frozen=True)
class LocalLayout:
    """``threads`` for every embedded engine (servers and the in-process conductor); ``serial``: one computes at
    a time (module docstring).

    >>> LocalLayout.parallel().serial, LocalLayout.serial_on(free=2).serial   # threads: the tests
    (False, True)
    """

    threads: int
    serial: bool

    @classmethod
    def parallel(cls) -> LocalLayout:
        """Every engine at once on all cores but one (or ``$CONDUCTOR_LOCAL_THREADS``): ``default_threads``."""
        return cls(threads=default_threads(), serial=False)

    @classmethod
    def serial_on(cls, free: int | None = None) -> LocalLayout:
        """One engine at a time on the ``free`` cores (None: measured now, unless the environment names a count)."""
        if os.environ.get(THREADS_ENV, "").strip():
            return cls(threads=default_threads(), serial=True)
        return cls(threads=free if free is not None else free_cores(), serial=True)


def free_cores(sample_s: float = 0.3) -> int:
    """The cores other processes leave idle now: all of them less the busy share measured over ``sample_s``
    (psutil; rounded, so a core half used by a neighbour still counts as free), at least one."""
    import psutil

    cores = os.cpu_count() or 1
    busy = psutil.cpu_percent(interval=sample_s) / 100 * cores
    return max(1, cores - round(busy))

