"""The Numba CUDA decoding gather (kernels/decode_cuda.py) under the simulator, against the reference decode, into
poisoned outputs: every codec and output dtype, odd widths, a constant row, bad ids flagged and clamped."""

import numpy as np
import pytest
import torch

from directload.codecs import encode
from directload.kernels.decode_cpu import CODEC_IDS, OUT_IDS
from directload.kernels.decode_cuda import OUT_BITS, decode_kernel

OUTS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("out_name", list(OUTS))
@pytest.mark.parametrize("name", list(CODEC_IDS))
@pytest.mark.parametrize("dim", [1, 3, 8, 13])
def test_matches_the_reference_decode(dim, name, out_name, index_dtype, rng):
    x = torch.from_numpy(rng.standard_normal((12, dim)).astype(np.float32)) * 3
    x[4] = 0.75  # a constant row
    table = encode(x, name)
    ids = rng.integers(0, 12, 9).astype(index_dtype)
    ids[3] = 12  # out of range: flagged, clamped to the last row
    out_id = OUT_IDS[out_name]
    out = np.full((9, dim), 0xFFFF, OUT_BITS[out_id])  # poisoned: NaN in every output dtype
    err = np.zeros(1, np.uint64)
    codes = table.codes.view(torch.uint8).numpy()
    decode_kernel(CODEC_IDS[name], out_id)[2, 32](codes, ids, out, dim, 12, err, 7)
    assert int(err[0]) == 7
    want = table.codec.decode(table.codes[torch.from_numpy(ids).long().clamp(max=11)], OUTS[out_name])
    got = torch.from_numpy(out.view(np.int32 if out_id == 0 else np.int16))
    assert torch.equal(got, want.view(torch.int32 if out_id == 0 else torch.int16))
