"""A remote tier as a plug-in writes one, outside directload: rows held 'elsewhere', every read a request served
by a thread of its own (as an RPC would be).  It implements only the contract's hooks (shape, ``_read_async``,
``_close``, ``_after_fork``) and counts through ``Counters``; the contract suite and the tier tests use it."""

import threading
from concurrent.futures import ThreadPoolExecutor

from directload.stores import FeatureStore, ReadFuture
from directload.stores.counters import Counters
from directload.stores.reads import deliver


class ToyRemote(FeatureStore):
    """``table``'s rows behind a server thread; ``gate`` (an Event) holds each request until set, and ``fail``
    (an exception) is raised by every request while set."""

    tier = "remote"

    def __init__(self, table, *, gate=None, fail=None):
        super().__init__()
        self._table, self._gate, self.fail = table.clone(), gate, fail
        self._server = ThreadPoolExecutor(1, thread_name_prefix="toy-remote")
        self._lock = threading.Lock()  # a request is queued, or the server shut, never both at once
        self._counts = Counters(("requests",))

    num_rows = property(lambda self: self._table.shape[0])
    row_shape = property(lambda self: tuple(self._table.shape[1:]))
    dtype = property(lambda self: self._table.dtype)

    def _read_async(self, index, out, run_device, out_device):
        ids = index.cpu().clone()

        def serve():
            if self._gate is not None:
                self._gate.wait(30)
            if self.fail is not None:
                raise self.fail
            self._counts.add(requests=1)
            return deliver(self._table[ids], out, out_device)

        with self._lock:
            self.check_open()  # closed by another thread since read_async's check: ClosedError
            return ReadFuture(future=self._server.submit(serve))

    def _close(self):
        with self._lock:
            self._server.shutdown(wait=False)
        self._server.shutdown()  # requests queued before the close are served

    def _after_fork(self):
        self._lock = threading.Lock()
        self._server = ThreadPoolExecutor(1, thread_name_prefix="toy-remote")  # the parent's thread stayed there
