"""The device seam's test fixture: a GPU for directload's batch path, emulated on the CPU.

:class:`EmulatedGpu` is a :class:`~directload.batch_device.BatchDevice` whose launchers run sample.cu's kernels
built with g++ (``kernels.host_emu_sample``), with the grid-stride loops turning over a small grid, into
poisoned buffers guarded past their ends.  Its tensors live on the CPU.  Pass it wherever directload takes a
device for its batch path (``NeighborSampler(..., device=gpu)``, the PyG and DGL loaders' ``device=``) and the
same Python code that runs on a GPU runs here: the drivers' buffer sizes and launch order, the relabelling,
the host reads (counted as on a GPU), and the batch's assembly.  What it does not prove: CUDA's own memory
model, streams and timings.

It is test machinery (it loads the host emulation): production code never imports it.

Examples
--------
>>> import torch
>>> from directload.emulated_gpu import EmulatedGpu
>>> from directload.graph import CSCGraph
>>> from directload.sampler import NeighborSampler
>>> g = CSCGraph.from_edge_index(torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]), num_nodes=4)
>>> gpu = EmulatedGpu()
>>> on_gpu = NeighborSampler(g, [2, 2], device=gpu).sample(torch.tensor([0]), key=7)
>>> twin = NeighborSampler(g, [2, 2]).sample(torch.tensor([0]), key=7)
>>> torch.equal(on_gpu.nodes, twin.nodes), gpu.reads.count  # one host read for the batch
(True, 1)
>>> gpu.check_guards()
"""

from __future__ import annotations

import torch

from directload.batch_device import BatchDevice, DeviceTable, HostReads, unified_table
from directload.kernels.host_emu_sample import Launcher

__all__ = ["EmulatedGpu"]


class EmulatedGpu(BatchDevice):
    """A GPU emulated on the CPU for the batch path (see the module's text).

    Parameters
    ----------
    grid, block : int
        The most blocks, and threads per block, of each emulated launch.

    Attributes
    ----------
    reads : HostReads
        Host reads the drivers made, counted as on a GPU.
    launches : int
        Kernel launches so far.
    uploads : int
        Host tensors copied to the "device" (:meth:`upload`).

    Examples
    --------
    >>> gpu = EmulatedGpu()
    >>> gpu.upload(torch.tensor([1, 2])).tolist(), gpu.uploads, gpu.device
    ([1, 2], 1, device(type='cpu'))
    """

    name = "emulated"

    def __init__(self, *, grid: int = 3, block: int = 32) -> None:
        self.device = torch.device("cpu")
        self.reads = HostReads()
        self.grid, self.block = grid, block
        self.uploads = 0
        self._launchers: list[Launcher] = []  # those not checked yet (check_guards lets them go)
        self._checked_launches = 0

    @property
    def launches(self) -> int:
        return self._checked_launches + sum(len(launcher.launched) for launcher in self._launchers)

    def launcher(self) -> Launcher:
        launcher = Launcher(self.grid, self.block, poison=True, reads=self.reads)
        self._launchers.append(launcher)
        return launcher

    def upload(self, values: torch.Tensor) -> torch.Tensor:
        self.uploads += 1
        return values.clone()  # a copy, as an upload is: the caller may change its host tensor after

    def readable(self, values: torch.Tensor) -> bool:
        return values.device.type == "cpu"

    def table(self, values: torch.Tensor) -> torch.Tensor:
        unified = unified_table(values, "host")
        if unified is None:
            return self.upload(values)
        return DeviceTable.of(unified, unified.host)

    def check_guards(self) -> None:
        """Raise ``EmulationError`` if any kernel wrote past a buffer the drivers sized since the last check
        (whose launchers, and the buffers their guards keep, are let go)."""
        for launcher in self._launchers:
            launcher.check_guards()
        self._checked_launches += sum(len(launcher.launched) for launcher in self._launchers)
        self._launchers = []
