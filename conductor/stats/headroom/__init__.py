r"""The headroom check: can this pool be won at all (pool-bound), or did the router fail (router-bound)?

Input: an ``OutcomeMatrix`` of every worker alone on the same questions, y[q, w] in {0, 1} (right or wrong)
and c[q, w] >= 0 (dollars), n questions, m workers, optionally each question's text and domain. Every point
below is (accuracy, bootstrap 95% interval over questions, dollars per question):

* **worker w alone**: acc_w = (1/n) sum_q y[q, w], $_w = (1/n) sum_q c[q, w].
  The best single worker b maximises acc_w (ties: cheaper, then first); the cheapest s minimises $_w
  (ties: more accurate, then first). b is picked in hindsight on the same questions, which biases it up a
  little and so makes a "router-bound" verdict conservative.
* **random-mix line** between s and b: send each question to b with probability lambda, else to s. Both
  coordinates are linear in lambda: acc(lambda) = (1 - lambda) acc_s + lambda acc_b and
  $(lambda) = (1 - lambda) $_s + lambda $_b, so at a cost x in [$_s, $_b] the line reads
  lambda(x) = (x - $_s) / ($_b - $_s); above $_b it stays at acc_b, below $_s it does not exist (NaN).
  This is what mixing without looking at the question buys (LLMRouterBench's Random baseline, made
  cost-aware). The cost-matched baseline the verdict uses is the best such mix of *any* two workers (or one
  worker alone) that spends at most x: the upper envelope of the workers' points (``best_mix_at_cost``), which
  contains the line above. Comparing a router only with the cheapest/best line would credit it for beating a
  line that some mid-priced worker already beats alone.
* **cross-fit routing oracle** X: questions are split into K folds (a permutation seeded by ``seed`` of the
  question ids in sorted order); for each fold f a router is fitted on the other K - 1 folds and picks, for
  each held-out question, w_X(q) = argmax_w  p^(q, w) - kappa c^(q, w)  (kappa: ``cost_weight``, accuracy
  per dollar, default 0; ties: lower expected cost, then lower index). acc_X = (1/n) sum_q y[q, w_X(q)].
  The learner (``CrossFitRouter``, numpy only) shrinks a kNN estimate towards a per-domain estimate, which
  shrinks towards the training accuracy:

      p_all(w) = mean over training questions of y[., w]
      p_dom(q, w) = (sum_{j in train, dom j = dom q} y[j, w] + beta p_all(w)) / (n_dom + beta)
      p^(q, w) = (sum_{j in N_k(q)} s_qj y[j, w] + alpha p_dom(q, w)) / (sum_{j in N_k(q)} s_qj + alpha)

  with N_k(q) the k training questions most cosine-similar to q over IDF-weighted hashed word features
  (``hashed_features``), s_qj = max(cosine, 0), k = 10, alpha = 1, beta = 2; c^ is the per-domain mean cost,
  shrunk the same way. Without text the kNN term drops out (per-domain best worker); without domains too,
  X is the cross-fit best single worker. Fitting on other questions is what keeps X honest: the in-sample
  argmax over noisy outcomes (the winner's curse that TinyRouter's diagnostic warns of) would count luck
  as routable. acc_X is what a router that sees only the question could achieve -- a lower bound, since a
  better learner might predict more.
* **any-correct oracle** A: per question the cheapest correct worker, or the cheapest worker when none is
  right (LLMRouterBench's Oracle). acc_A = (1/n) sum_q max_w y[q, w] >= acc_w for every w and >= acc_X;
  $_A = (1/n) sum_q c[q, w_A(q)]. Not reachable by any router: it reads the answers.

Intervals resample questions with replacement (``n_boot`` draws, percentile 2.5..97.5, the same seeded
resamples for every point). Paired tests on the same questions reuse ``conductor.stats.paired``:
``paired_bootstrap`` (diff, 95% interval, one-sided p) and, for 0/1 outcomes, ``mcnemar_exact`` on
b = #(candidate right, baseline wrong), c = #(candidate wrong, baseline right).

**Verdict** (margin: ``margin``, default 1 point; alpha: ``alpha``, default 0.05; "significantly": diff > 0
and one-sided p < alpha on every paired test that applies):

1. *pool-bound* when the any-correct oracle's gain over b is within noise: its paired interval's lower bound
   <= margin. Even a clairvoyant router could not win here: change the pool.
2. *pool-bound* when X is significantly above neither b nor the best random mix at X's own cost: the pool's
   complementarity exists in hindsight but is not predictable from the question.
3. *router-bound* otherwise: X beats b (or the best random mix at equal cost) significantly, so a router could win,
   and a policy that does not is the problem. An optional ``PolicyOutcome`` (a trained conductor's run) is
   placed between b and X: captured = (acc_P - acc_b) / (acc_X - acc_b), NaN when acc_X <= acc_b (no
   headroom to capture; TinyRouter's ``router_gap_closed`` contract).

References: TinyRouter's oracle-ceiling diagnostic (github.com/philluiz2323/Gittensor-TinyRouter,
docs/ORACLE_CEILING_DIAGNOSTIC.md): the cross-fit oracle as the honest routing ceiling, the "solved by any"
oracle shown separately as not routing-achievable, bootstrap intervals over queries, McNemar and paired
bootstrap against the best single model, a verdict read off intervals, the captured-headroom ratio.
LLMRouterBench (Li et al., 2026, arXiv 2601.07206): BestSingle, Random and Oracle (cheapest correct model per
query) on the accuracy-cost plane. Details and how to read a report: docs/headroom.md.

One role per module: ``model`` (the input and the measured records, the random-mix baseline), ``router`` (the
cross-fit learner), ``bootstrap`` (intervals and paired tests), ``verdict`` (the result and its rule),
``report`` (JSON, Markdown, plot, files), ``check`` (``headroom_report``, which measures them all).
"""

from conductor.stats.headroom.bootstrap import bootstrap_intervals, paired
from conductor.stats.headroom.check import headroom_report
from conductor.stats.headroom.model import (
    DEFAULT_ALPHA,
    DEFAULT_FOLDS,
    DEFAULT_MARGIN,
    DEFAULT_N_BOOT,
    CrossFitRouter,
    OutcomeMatrix,
    PairedComparison,
    Point,
    PolicyOutcome,
    RandomMixLine,
    Verdict,
    best_mix_at_cost,
)
from conductor.stats.headroom.report import HeadroomReport
from conductor.stats.headroom.router import (
    ALPHA_PRIOR,
    BETA_PRIOR,
    HASH_DIM,
    K_NEIGHBOURS,
    LEARNER,
    cross_fit_choices,
    hashed_features,
    route,
)
from conductor.stats.headroom.verdict import HeadroomVerdict

__all__ = [
    "ALPHA_PRIOR", "BETA_PRIOR", "DEFAULT_ALPHA", "DEFAULT_FOLDS", "DEFAULT_MARGIN", "DEFAULT_N_BOOT", "HASH_DIM",
    "K_NEIGHBOURS", "LEARNER", "CrossFitRouter", "HeadroomReport", "HeadroomVerdict", "OutcomeMatrix",
    "PairedComparison", "Point", "PolicyOutcome", "RandomMixLine", "Verdict", "best_mix_at_cost", "bootstrap_intervals",
    "cross_fit_choices", "hashed_features", "headroom_report", "paired", "route",
]
