"""The cross-fit routing oracle's learner: a kNN over hashed words shrunk towards per-domain and overall rates
(numpy only), and the cross-fit that routes each fold with a router fitted on the other folds."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np

from conductor.stats.headroom.model import OutcomeMatrix

K_NEIGHBOURS = 10
ALPHA_PRIOR = 1.0       # the domain estimate counts as one perfectly similar neighbour
BETA_PRIOR = 2.0        # the training accuracy counts as two questions of the domain
HASH_DIM = 2048
LEARNER = (f"kNN (k={K_NEIGHBOURS}, cosine over IDF-weighted hashed words, {HASH_DIM} buckets) shrunk towards the "
           f"per-domain rate (prior weight {ALPHA_PRIOR:g}), itself shrunk towards the training rate (prior weight "
           f"{BETA_PRIOR:g} questions)")
_WORD = re.compile(r"[a-z]+[a-z0-9]*")


def hashed_features(texts: Sequence[str], dim: int = HASH_DIM) -> np.ndarray:
    """Binary bag of words (lower-case, numbers dropped: they identify a question, not its kind), hashed with
    CRC-32 into ``dim`` buckets (stable across runs, unlike ``hash``), IDF-weighted, L2-normalised rows.

    >>> X = hashed_features(["Integrate x squared", "integrate the sine", "Write a sonnet 42"])
    >>> X.shape, bool(X[0] @ X[1] > 0), float(X[0] @ X[2]), float(np.round(np.linalg.norm(X[2]), 6))
    ((3, 2048), True, 0.0, 1.0)
    """
    X = np.zeros((len(texts), dim), dtype=np.float32)
    for i, t in enumerate(texts):
        for tok in set(_WORD.findall((t or "").lower())):
            X[i, zlib.crc32(tok.encode()) % dim] = 1.0
    df = X.sum(axis=0)
    X *= (np.log((1 + len(texts)) / (1 + df)) + 1.0).astype(np.float32)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


def route(correct: np.ndarray, cost: np.ndarray, train: np.ndarray, test: np.ndarray, *,
          features: np.ndarray | None = None, domains: Sequence[str] | None = None,
          cost_weight: float = 0.0, k: int = K_NEIGHBOURS) -> np.ndarray:
    """Fit on the ``train`` rows, pick a worker for each ``test`` row from its features and domain only.

    >>> y = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool)
    >>> route(y, np.zeros((4, 2)), np.array([0, 2]), np.array([1, 3]), domains=["m", "m", "p", "p"]).tolist()
    [0, 1]
    >>> route(y, np.zeros((4, 2)), np.array([0, 2]), np.array([1, 3])).tolist()    # no features: one worker
    [0, 0]
    """
    yt = correct[train].astype(float)
    ct = cost[train]
    p_all, c_all = yt.mean(axis=0), ct.mean(axis=0)
    p_prior = np.tile(p_all, (len(test), 1))
    c_prior = np.tile(c_all, (len(test), 1))
    if domains is not None:
        dom = np.asarray(domains, dtype=object)
        for d in set(dom[test].tolist()):
            rows = dom[test] == d
            mask = dom[train] == d
            n_d = int(mask.sum())
            p_prior[rows] = (yt[mask].sum(axis=0) + BETA_PRIOR * p_all) / (n_d + BETA_PRIOR)
            c_prior[rows] = (ct[mask].sum(axis=0) + BETA_PRIOR * c_all) / (n_d + BETA_PRIOR)
    p_hat = p_prior
    if features is not None and len(train):
        sim = np.clip(features[test] @ features[train].T, 0.0, None).astype(float)
        kk = min(k, len(train))
        if kk < len(train):       # keep each row's k most similar training questions
            cut = np.argpartition(-sim, kk - 1, axis=1)[:, kk:]
            np.put_along_axis(sim, cut, 0.0, axis=1)
        p_hat = (sim @ yt + ALPHA_PRIOR * p_prior) / (sim.sum(axis=1, keepdims=True) + ALPHA_PRIOR)
    score = np.round(p_hat - cost_weight * c_prior, 12)
    out = np.empty(len(test), dtype=int)
    for i in range(len(test)):
        out[i] = int(np.lexsort((np.arange(score.shape[1]), np.round(c_prior[i], 15), -score[i]))[0])
    return out


def cross_fit_choices(m: OutcomeMatrix, k: int, seed: int, cost_weight: float) -> tuple[np.ndarray, str]:
    """The cross-fit oracle's worker per question (each fold routed by a router fit on the other folds), and the
    features it routed on."""
    n = m.n_questions
    fold = np.empty(n, dtype=int)
    fold[np.random.default_rng(seed).permutation(n)] = np.arange(n) % k
    feats = hashed_features(m.texts) if m.texts is not None and any(t.strip() for t in m.texts) else None
    doms = m.domains
    chosen = np.empty(n, dtype=int)
    for f in range(k):
        test = np.flatnonzero(fold == f)
        train = np.flatnonzero(fold != f)
        chosen[test] = route(m.correct, m.cost_usd, train, test, features=feats, domains=doms,
                             cost_weight=cost_weight)
    features = ("text+domain" if feats is not None and doms is not None else "text" if feats is not None
                else "domain" if doms is not None else "none")
    return chosen, features
