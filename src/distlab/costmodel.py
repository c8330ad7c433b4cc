"""Bandwidth arithmetic and the alpha-beta cost model, in one place.

Why one module: the trace table, the benchmark and the notebooks all convert bytes and
seconds into bandwidth, and they must agree. The bus-bandwidth factors are the ones
nccl-tests uses (doc/PERFORMANCE.md there): they rescale the algorithm bandwidth so that
the figure is comparable with the link speed whatever the world size.

The alpha-beta model says one message of ``b`` bytes costs ``alpha + beta * b`` seconds:
``alpha`` is the latency (start-up cost), ``1 / beta`` the bandwidth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# op -> function of the group size n giving busbw / algbw (nccl-tests).
_BUS_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}

# Aliases: every spelling torch has for the same collective.
_ALIASES = {
    "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "isend": "send",
    "irecv": "recv",
    "batch_isend_irecv": "send",
    "all_reduce_coalesced": "all_reduce",
    "monitored_barrier": "barrier",
}


def canonical_op(op: str) -> str:
    """Map torch's many names for one collective to the nccl-tests name (others unchanged)."""
    return _ALIASES.get(op, op)


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks; 1.0 for operations nccl-tests does not cover."""
    if n < 1:
        raise ValueError(f"group size must be >= 1, got {n}")
    f = _BUS_FACTORS.get(canonical_op(op))
    return f(n) if f is not None else 1.0


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes/s, as nccl-tests prints it)."""
    return size_bytes / seconds / 1e9 if seconds > 0 else float("nan")


def busbw(op: str, n: int, size_bytes: float, seconds: float) -> float:
    """Bus bandwidth in GB/s: algbw times the nccl-tests factor of ``op`` on ``n`` ranks."""
    return algbw(size_bytes, seconds) * bus_factor(op, n)


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted ``t = alpha + beta * bytes`` (seconds, seconds per byte)."""

    alpha: float
    beta: float

    def predict(self, nbytes: float | Sequence[float] | np.ndarray) -> np.ndarray:
        """Predicted time in seconds for each message size."""
        return self.alpha + self.beta * np.asarray(nbytes, dtype=float)

    @property
    def bandwidth(self) -> float:
        """Asymptotic bandwidth 1/beta in GB/s."""
        return 1.0 / self.beta / 1e9 if self.beta > 0 else float("inf")

    def __str__(self) -> str:
        return f"alpha = {self.alpha * 1e6:.2f} us, 1/beta = {self.bandwidth:.3f} GB/s"


def fit_alpha_beta(
    nbytes: Sequence[float] | np.ndarray,
    seconds: Sequence[float] | np.ndarray,
    relative: bool = True,
) -> AlphaBeta:
    """Least-squares fit of ``t = alpha + beta * bytes``.

    With ``relative=True`` (default) each point is weighted by 1/t, i.e. the fit minimises
    relative error: message sizes span five decades, and a plain fit would let the largest
    message decide alpha too (its absolute error dwarfs every small message's time).
    """
    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if x.shape != t.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError("need two equal-length 1-D sequences with at least 2 points")
    if len(np.unique(x)) < 2:
        raise ValueError("need at least two distinct message sizes")
    a = np.stack([np.ones_like(x), x], axis=1)
    w = 1.0 / t if relative else np.ones_like(t)
    (alpha, beta), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    return AlphaBeta(alpha=float(alpha), beta=float(beta))


def ring_all_reduce_time(model: AlphaBeta, n: int, nbytes: float) -> float:
    """Model time of a ring all_reduce: 2(n-1) steps, each moving nbytes/n."""
    if n == 1:
        return 0.0
    return 2 * (n - 1) * (model.alpha + model.beta * nbytes / n)
