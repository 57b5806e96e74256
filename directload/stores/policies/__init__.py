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

from .base import Policy, simulate
from .clock import Clock
from .correlation import Correlation
from .lookahead import LookAhead, belady
from .lru import LRU
from .s3fifo import S3FIFO
from .sieve import Sieve
from .static import Static, degree, presample

POLICIES = {"lru": LRU, "clock": Clock, "sieve": Sieve, "s3fifo": S3FIFO}

__all__ = ["Policy", "simulate", "LRU", "Clock", "Sieve", "S3FIFO", "Correlation", "Static", "degree", "presample",
           "LookAhead", "belady", "POLICIES"]
