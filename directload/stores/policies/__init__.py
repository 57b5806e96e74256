"""Cache policies: which rows a cache keeps, one small pure module each, shared by the caches and by the
offline trace simulator (:func:`simulate`).

Every policy answers one question per batch, :meth:`Policy.access`: given the batch's distinct row ids,
which were cached (hits), admitting the misses and evicting as it decides.  Look-ahead policies also take
:meth:`Policy.see` with the batches that come next, as the loaders know them.

* recency and frequency: :class:`LRU`, :class:`Clock`, :class:`Sieve`, :class:`S3FIFO` (GraphBolt's set);
* static: :class:`Static` from scores (:func:`degree`, as PaGraph/quiver; :func:`presample`, as GNNLab);
* pages with correlation prefetch: :class:`Correlation` (DeepUM-style, a baseline);
* the future: :class:`LookAhead` (Belady over a window of known batches); :func:`belady` is it over the
  whole epoch, the optimum, for evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import Policy, simulate
from .clock import Clock
from .correlation import Correlation
from .lookahead import LookAhead, belady
from .lru import LRU
from .s3fifo import S3FIFO
from .sieve import Sieve
from .static import Static, degree, presample

if TYPE_CHECKING:
    from typing import TypeAlias

    #: What a cache takes as its policy: a name of :data:`POLICY_NAMES`, a policy or a callable
    #: ``capacity -> Policy``.
    PolicySpec: TypeAlias = str | Policy | Callable[[int], Policy]

POLICIES = {"lru": LRU, "clock": Clock, "sieve": Sieve, "s3fifo": S3FIFO}

#: Policy names a cache takes (or pass a Policy, or a callable ``capacity -> Policy``).
POLICY_NAMES = ("lookahead", *POLICIES)


def make_policy(policy: PolicySpec, capacity: int, *, num_rows: int | None = None) -> Policy:
    """A :class:`Policy` of ``capacity`` rows from a name of :data:`POLICY_NAMES`, a policy or a callable
    ``capacity -> Policy``; ``num_rows``, the rows of the cache's table where known, bounds the look-ahead
    policy's arrays indexed by row id.

    Examples
    --------
    >>> make_policy("lru", 8).capacity, make_policy("lookahead", 3200).slack
    (8, 100)
    """
    if isinstance(policy, str):
        if policy == "lookahead":  # evicting 1/32 more at a pass: passes over the held rows come a few batches apart
            return LookAhead(capacity, slack=capacity // 32, num_rows=num_rows)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICY_NAMES}, a Policy or a callable, not {policy!r}")
        return POLICIES[policy](capacity)
    if isinstance(policy, Policy):
        got = policy
    elif callable(policy):
        got = policy(capacity)
        if not isinstance(got, Policy):
            raise TypeError(f"the policy factory returned a {type(got).__name__}, not a Policy")
    else:
        raise TypeError(f"policy must be a name, a Policy or a callable, not {type(policy).__name__}")
    if got.capacity > capacity:
        raise ValueError(f"the policy keeps {got.capacity} rows but the cache has room for {capacity}")
    return got


def policy_class(policy: PolicySpec) -> type[Policy]:
    """The class of the policy ``policy`` names or is (:class:`Policy` itself for a callable, whose class is
    known only once called): what :meth:`Policy.bytes_for` is asked of before a cache is made.

    Examples
    --------
    >>> policy_class("lru").__name__, policy_class("lookahead").__name__, policy_class(LRU).__name__
    ('LRU', 'LookAhead', 'Policy')
    """
    if isinstance(policy, str):
        return LookAhead if policy == "lookahead" else POLICIES.get(policy, Policy)
    return type(policy) if isinstance(policy, Policy) else Policy


__all__ = ["Policy", "simulate", "LRU", "Clock", "Sieve", "S3FIFO", "Correlation", "Static", "degree", "presample",
           "LookAhead", "belady", "POLICIES", "POLICY_NAMES", "make_policy", "policy_class"]
