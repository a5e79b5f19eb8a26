"""One home for the statistics that ``run/`` and ``learning/`` both read.

``headroom``: can this worker pool be won at all (pool-bound), or did the router fail (router-bound)? Per-worker
points, the random-mix line, the cross-fit routing oracle and the any-correct oracle, with bootstrap intervals
and paired tests. ``paired``: the paired statistics on the same questions that evaluation (candidate against
champion), ``conductor compare`` (a strategy against the best single worker) and the headroom check share:
question-level mean and standard error, a paired bootstrap over questions, McNemar's exact test. ``routellm``:
RouteLLM's metrics. Import the modules by path; the package imports nothing, so reading ``paired`` does not
load numpy.
"""
