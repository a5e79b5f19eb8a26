"""Running a workflow over a sub-pool: the executor, recursion rounds, and what every worker call
goes through (response cache, retries, rate limits shared across processes, batch APIs).
"""
