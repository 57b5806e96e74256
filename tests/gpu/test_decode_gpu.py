"""The decoding gather on a real device (skipped without one): CUDA ids over codes in pinned, mapped memory and in
device memory, the fused kernel and torch's path each against the reference decode, into poisoned outputs, with no
host sync on the way; a bad id raised, not a device assert."""

import pytest
import torch

from directload.capabilities import capabilities
from directload.codecs import EncodedTable, encode
from directload.kernels import decode, gather

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _bits(t):
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


@pytest.mark.parametrize("path", ["fused", "torch"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["int8", "float16", "bfloat16"])
@pytest.mark.parametrize("dim", [1, 3, 64, 100, 129])
@pytest.mark.parametrize("where", ["pinned", "cuda"])
def test_matches_the_reference_decode(where, dim, name, out_dtype, path, rng):
    if path == "fused" and not capabilities().cupy:
        pytest.skip("the fused GPU kernel runs through CuPy")
    host = encode(torch.from_numpy(rng.standard_normal((513, dim))).float() * 3, name)
    codes = host.codes.pin_memory() if where == "pinned" else host.codes.cuda()
    ids = torch.from_numpy(rng.integers(0, 513, 700)).cuda()
    out = torch.full((700, dim), float("nan"), dtype=out_dtype, device="cuda")
    decode.gather_encoded(EncodedTable(codes, host.codec), ids, out=out, path=path).wait()
    want = host.codec.decode(host.codes[ids.cpu()], out_dtype)
    assert torch.equal(_bits(out.cpu()), _bits(want))


def test_a_bad_cuda_id_raises_an_index_error(rng):
    table = encode(torch.randn(10, 8), "int8")
    table = EncodedTable(table.codes.pin_memory(), table.codec)
    with pytest.raises(IndexError):
        gather(table, torch.tensor([3, 10], device="cuda"))
        torch.cuda.synchronize()
        gather(table, torch.tensor([0], device="cuda"))
