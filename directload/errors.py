"""``DirectloadError``: the base of every error directload raises of its own.

Each error keeps its builtin base as well (``ValueError``, ``OSError``,
``RuntimeError``, ...), so ``except ValueError`` still catches a
:class:`~directload.graph.GraphError`, and ``except DirectloadError`` catches
every error of directload's own (a builtin ``TypeError`` or ``IndexError``
about a caller's argument stays what it is).
"""

__all__ = ["DirectloadError"]


class DirectloadError(Exception):
    """The base of directload's own errors.

    Examples
    --------
    >>> import torch
    >>> from directload.errors import DirectloadError
    >>> from directload.graph import CSCGraph
    >>> try:
    ...     CSCGraph(torch.tensor([0, 2, 1]), torch.tensor([0, 1]))
    ... except DirectloadError as exc:
    ...     print(type(exc).__name__, isinstance(exc, ValueError))
    GraphError True
    """
