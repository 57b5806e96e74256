"""The tuner's keys: what a tuned choice of GPU gather holds for.  Pure but for :func:`environment`.

A key names where a gather runs (the GPU, its driver, torch and its CUDA runtime, a hash of the kernel
sources), so a new driver, torch or kernel is a new key, timed afresh; and the kind of gather (row bytes,
element size, alignment, a bucket of the id count and one of the table's bytes).
"""

# No ``from __future__ import annotations`` here: TuneKey.from_json reads its fields' types at runtime.

import ctypes
import functools
import hashlib
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Self

import torch

from .sources import CUDA_DIR

__all__ = ["TuneKey", "key_for", "environment", "sources_hash", "id_bucket", "table_bucket", "nvidia_module_version"]

# Where the timed kernels come from: a change to any of these is a new key.  The host emulation's shims
# (cuda_shim.h, emu_launch.cpp) never run on a GPU.
_SOURCE_FILES = ("variants.py", "cupy_backend.py", "numba_cuda.py", "numba_kernels.py")


def id_bucket(n_ids: int) -> int:
    """The power of 2 at or below ``n_ids`` (0 for none): ids ``[b, 2b)`` share a choice.

    >>> id_bucket(0), id_bucket(1), id_bucket(1023), id_bucket(1024), id_bucket(2047)
    (0, 1, 512, 1024, 1024)
    """
    return 1 << (n_ids.bit_length() - 1) if n_ids > 0 else 0


def table_bucket(n_bytes: int) -> int:
    """The power of 4 at or below ``n_bytes`` (0 for none): tables of ``[b, 4b)`` bytes share a choice.

    >>> table_bucket(0), table_bucket(1 << 28), table_bucket((1 << 30) - 1), table_bucket(1 << 30)
    (0, 268435456, 268435456, 1073741824)
    """
    return 1 << (2 * ((n_bytes.bit_length() - 1) // 2)) if n_bytes > 0 else 0


@functools.cache
def sources_hash() -> str:
    """The first 16 hex digits of a SHA-256 over the GPU kernels' sources: ``kernels/cuda/*.cu`` and the
    Python that builds and launches them.

    >>> len(sources_hash())
    16
    """
    here = Path(__file__).parent
    paths = sorted(CUDA_DIR.glob("*.cu")) + sorted(CUDA_DIR.glob("*.cuh")) + [here / n for n in _SOURCE_FILES]
    digest = hashlib.sha256()
    for path in paths:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def nvidia_module_version(text: str) -> str:
    """The driver's version in the text of ``/proc/driver/nvidia/version`` (``""`` if none).

    >>> nvidia_module_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024")
    '550.54.15'
    >>> nvidia_module_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release")
    '570.86.15'
    """
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d[\w.-]*)", text)
    return found.group(1) if found else ""


@functools.cache
def _driver_version():
    """The NVIDIA kernel module's version (``550.54.15``), else the CUDA driver API's (``cuda 12040``)."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            version = nvidia_module_version(f.read())
        if version:
            return version
    except OSError:
        pass
    try:
        api = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(api)) == 0:  # needs no cuInit
            return f"cuda {api.value}"
    except (OSError, AttributeError):
        pass
    return ""


_environments: dict[int, tuple[str, str, str, str, str]] = {}


def environment(device: torch.device | int | str) -> tuple[str, str, str, str, str]:
    """The fields of a key that describe where it runs: ``gpu``, ``driver``, ``torch``, ``cuda`` (the
    runtime torch was built with) and ``sources`` (:func:`sources_hash`).  Asked once per device.

    Parameters
    ----------
    device : torch.device, int or str
        A CUDA device.

    Returns
    -------
    tuple of str
        ``(gpu, driver, torch, cuda, sources)``, in :class:`TuneKey`'s order.

    Examples
    --------
    >>> environment("cuda:0")  # doctest: +SKIP
    ('NVIDIA H100 PCIe', '550.54.15', '2.11.0+cu128', '12.8', '0123456789abcdef')
    """
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"the tuner times CUDA gathers, not gathers on {device}")
        index = torch.cuda.current_device() if device.index is None else device.index
    env = _environments.get(index)
    if env is None:
        env = (torch.cuda.get_device_name(index), _driver_version(), torch.__version__, torch.version.cuda or "",
               sources_hash())
        _environments[index] = env
    return env


@dataclass(frozen=True, order=True)
class TuneKey:
    """What a tuned choice holds for: where it runs and the kind of gather.

    Attributes
    ----------
    gpu, driver, torch, cuda, sources : str
        The GPU's name, the NVIDIA driver's version, torch's version, the CUDA runtime torch was built with
        and :func:`sources_hash`.
    row_bytes, elem_bytes : int
        Bytes of a row and of an element.
    align : int
        :func:`directload.kernels.variants.legal_width` of the two tables (1-16): which widths are legal.
    ids : int
        :func:`id_bucket` of the id count.
    table : int
        :func:`table_bucket` of the table's bytes.

    Examples
    --------
    >>> env = ("NVIDIA H100 PCIe", "550.54.15", "2.11.0", "12.8", "0123456789abcdef")
    >>> key = TuneKey.of(env, row_bytes=400, elem_bytes=4, n_ids=3000, n_rows=1 << 20, align=16)
    >>> key.ids, key.table, TuneKey.from_json(key.to_json()) == key
    (2048, 268435456, True)
    """

    gpu: str
    driver: str
    torch: str
    cuda: str
    sources: str
    row_bytes: int
    elem_bytes: int
    align: int
    ids: int
    table: int

    @classmethod
    def of(cls, env: tuple[str, str, str, str, str], row_bytes: int, elem_bytes: int, n_ids: int, n_rows: int,
           align: int = 16) -> Self:
        """The key of a gather of ``n_ids`` rows of ``row_bytes`` from a table of ``n_rows``, run in ``env``
        (:func:`environment`'s tuple)."""
        return cls(*env, row_bytes, elem_bytes, align, id_bucket(n_ids), table_bucket(n_rows * row_bytes))

    def to_json(self) -> dict[str, Any]:
        """A plain dict of the fields."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> Self:
        """The inverse of :meth:`to_json`; ``ValueError`` for anything else."""
        if not isinstance(data, dict) or set(data) != {f.name for f in fields(cls)}:
            raise ValueError(f"a tuner key has the fields {[f.name for f in fields(cls)]}, got {data!r:.200}")
        for f in fields(cls):
            want = str if f.type is str else int
            if type(data[f.name]) is not want or (want is int and data[f.name] < 0):
                raise ValueError(f"a tuner key's {f.name} is a {want.__name__} (>= 0), got {data[f.name]!r:.80}")
        return cls(**data)


def key_for(device: torch.device | int | str, row_bytes: int, elem_bytes: int, n_ids: int, n_rows: int,
            align: int = 16) -> TuneKey:
    """The :class:`TuneKey` of a gather on CUDA ``device``: :meth:`TuneKey.of` in :func:`environment`.

    Examples
    --------
    >>> key_for("cuda:0", 400, 4, 4096, 1 << 20).ids  # doctest: +SKIP
    4096
    """
    return TuneKey.of(environment(device), row_bytes, elem_bytes, n_ids, n_rows, align)
