"""``DirectloadError``: the base of every error directload raises of its own; ``DirectloadWarning``: of every
warning it gives.

Each error keeps its builtin base as well (``ValueError``, ``OSError``,
``RuntimeError``, ...), so ``except ValueError`` still catches a
:class:`~directload.graph.GraphError`, and ``except DirectloadError`` catches
every error of directload's own (a builtin ``TypeError`` or ``IndexError``
about a caller's argument stays what it is).
"""

__all__ = ["DirectloadError", "DirectloadWarning", "SamplerWarning", "rethrown"]


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


class DirectloadWarning(UserWarning):
    """The base of every warning directload gives, so that one filter quiets or raises them all.

    Each warning keeps a builtin category as well where one says more (a :class:`RuntimeWarning` for a
    condition of the machine or its files), so ``warnings.simplefilter("ignore", RuntimeWarning)`` still
    applies to it.

    Examples
    --------
    >>> import warnings
    >>> from directload.errors import DirectloadWarning, SamplerWarning
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always", DirectloadWarning)
    ...     warnings.warn("PyG's own sampler runs instead", SamplerWarning)
    >>> [issubclass(w.category, DirectloadWarning) for w in caught]
    [True]
    """


class SamplerWarning(DirectloadWarning):
    """The sampler that runs is not the one asked for: the framework's own (an option directload's sampler
    does not implement, or a sampler of the caller's), or directload's (the framework has none here).

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("ignore", SamplerWarning)  # the fallback is known and wanted
    ...     warnings.warn("PyG's own sampler runs instead", SamplerWarning)
    >>> caught
    []
    """


def rethrown(exc: BaseException) -> BaseException:
    """A fresh exception of ``exc``'s own type, arguments and notes (an ``OSError`` stays an ``OSError``), for a
    caller to raise ``from exc`` when ``exc`` was raised on another thread (whose traceback it keeps); a
    ``RuntimeError`` naming it where its type cannot be built again from its arguments.

    Examples
    --------
    >>> got = rethrown(KeyError("k"))
    >>> type(got).__name__, got.args, got.__traceback__ is None
    ('KeyError', ('k',), True)
    """
    try:
        # as copy.copy does: an OSError keeps its filename
        reduced: tuple = exc.__reduce__()  # type: ignore[assignment]  # an exception's __reduce__ is a tuple
        make, args, *state = reduced
        clone = make(*args)
        clone.__dict__.update(state[0] if state and state[0] else {})  # its attributes and notes
    except Exception:  # noqa: BLE001 - an exception type whose constructor takes other arguments
        notes = " ".join(getattr(exc, "__notes__", ()))
        return RuntimeError(f"{exc!r} {notes}".strip())
    clone.__traceback__ = clone.__cause__ = clone.__context__ = None
    return clone
