"""A cache read's GPU work is not waited for on the batch path: its staging buffer goes back with a fence (the
buffer's next user waits for it, on the host, and only then), and a waiter of the read orders its streams after
the fence.  The bookkeeping runs everywhere; the events themselves only on a GPU (tests/gpu, the kit)."""

import threading

import pytest
import torch

from directload.stores import ReadFuture
from directload.stores.held import Fence, Workspace


class _Fence:
    """A fence whose wait is recorded (the events' host wait, on a GPU)."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait(self):
        self.log.append(self.name)


def test_a_buffer_is_lent_again_only_after_its_fence_and_the_oldest_idle_first():
    log = []
    work = Workspace(keep=4, pin="never")
    a, b = work.take(), work.take()
    work.give(a, _Fence(log, "a"))
    work.give(b, _Fence(log, "b"))
    assert work.take() is a and log == ["a"]  # the longest idle: its GPU work the likeliest done
    assert work.take() is b and log == ["a", "b"]
    work.give(a)  # no fence: nothing to wait for
    assert work.take() is a and log == ["a", "b"]


def test_a_fence_is_waited_for_once_and_release_waits_for_the_idle_ones():
    log = []
    work = Workspace(keep=2, pin="never")
    a = work.take()
    work.give(a, _Fence(log, "a"))
    assert work.take() is a and log == ["a"]
    work.give(a)
    assert work.take() is a and log == ["a"]  # a later give without a fence: the old one is not waited again
    work.give(a, _Fence(log, "again"))
    work.release()  # the buffers go only once the GPU is done with them
    assert log == ["a", "again"]
    assert work.take() is not a


def test_a_buffer_kept_out_of_the_idle_list_drops_its_fence():
    log = []
    work = Workspace(keep=0, pin="never")
    a = work.take()
    work.give(a, _Fence(log, "a"))  # not kept (keep=0): nobody reuses it, nothing waits
    assert work.take() is not a and log == []


def test_a_read_future_orders_its_waiter_after_each_wait_and_not_after_a_failure():
    calls = []
    ok = ReadFuture(result=torch.ones(1), ordered=lambda: calls.append(threading.get_ident()))
    ok.wait()
    ok.wait()
    assert calls == [threading.get_ident()] * 2  # in the waiting thread, every time: each may run other streams

    def fail():
        raise ValueError("the read failed")

    bad = ReadFuture(run=fail, ordered=lambda: calls.append("no"))
    with pytest.raises(ValueError):
        bad.wait()
    assert "no" not in calls


def test_there_is_no_fence_without_a_cuda_device():
    assert Fence.after(torch.device("cpu"), None) is None
    if not torch.cuda.is_available():
        return
    fence = Fence.after(torch.device("cuda"))
    fence.wait()
    fence.order()
