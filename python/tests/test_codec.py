"""Single-process tests: library loading, errors, codec helpers."""

import numpy as np
import pytest
import torch

import squall
from squall import codec


def test_version_and_library():
    assert squall.version() == "0.1.0"
    assert codec.implementation() in ("scalar", "avx2", "avx512")


def test_error_classes():
    with pytest.raises(squall.SquallInvalidArgument, match="unknown codec"):
        codec.parse_codec("nonsense")
    assert issubclass(squall.SquallInvalidArgument, squall.SquallError)
    assert issubclass(squall.SquallInvalidArgument, ValueError)
    assert issubclass(squall.SquallTimeout, TimeoutError)
    try:
        codec.parse_codec("onebit:block=3")
    except squall.SquallError as e:
        assert e.code == 1 and str(e)


def test_codec_spec_roundtrip():
    for text in ("onebit", "onebit:block=4096", "onebit:scale=rms", "int8:block=256", "fp16",
                 "bf16", "none"):
        spec = codec.parse_codec(text)
        assert codec.codec_string(codec.parse_codec(codec.codec_string(spec))) == \
            codec.codec_string(spec)
    assert codec.codec_string(codec.parse_codec("onebit")) == "onebit:block=2048"


def test_onebit_encode_decode_closed_form():
    x = torch.randn(3 * 2048 + 100)
    wire = codec.encode(x, "onebit")
    assert len(wire) == codec.encoded_size("onebit", x.numel())
    assert codec.inspect(wire) == ("onebit:block=2048", x.numel())
    y = torch.from_numpy(codec.decode(wire))
    for b in range(4):
        blk, dec = x[b * 2048:(b + 1) * 2048], y[b * 2048:(b + 1) * 2048]
        expected = torch.where(blk >= 0, 1.0, -1.0) * blk.abs().mean()
        assert torch.allclose(dec, expected, rtol=1e-6, atol=0)


def test_fp16_decode_into_tensor_and_accumulate():
    x = torch.randn(1000)
    out = torch.zeros(1000)
    codec.decode(codec.encode(x, "fp16"), out=out)
    assert torch.equal(out, x.half().float())
    codec.decode(codec.encode(x, "fp16"), out=out, accumulate=True)
    assert torch.equal(out, 2 * x.half().float())
    # bf16 and fp16 inputs
    assert torch.equal(torch.from_numpy(codec.decode(codec.encode(x.bfloat16(), "bf16"))),
                       x.bfloat16().float())
    a = np.arange(10, dtype=np.float16)
    assert np.array_equal(codec.decode(codec.encode(a, "fp16")), a.astype(np.float32))


def test_residual_error_feedback():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    r = codec.Residual(x.numel())
    wire = codec.encode(x, "onebit", residual=r)
    # what the encoding lost is carried in the residual: x == decoded + residual
    assert np.allclose(codec.decode(wire) + r.read(), x.numpy(), atol=1e-6)
    total = codec.decode(wire)
    for _ in range(199):
        total += codec.decode(codec.encode(x, "onebit", residual=r))
    # the running mean converges (in mean; outliers take longer)
    assert np.abs(total / 200 - x.numpy()).mean() < 0.03
    r.reset()
    assert not r.read().any()
    r.write(np.ones(4096, np.float32))
    assert (r.read() == 1).all()
    assert r.skipped == 0
    with pytest.raises(squall.SquallInvalidArgument, match="residual holds"):
        codec.encode(torch.zeros(10), "onebit", residual=r)


def test_bad_buffers():
    with pytest.raises(squall.SquallInvalidArgument, match="not contiguous"):
        codec.encode(torch.zeros(8, 8).t(), "onebit")
    with pytest.raises(squall.SquallInvalidArgument, match="sparse"):
        codec.encode(torch.zeros(8).to_sparse(), "onebit")
    with pytest.raises(squall.SquallInvalidArgument, match="dtype torch.int32"):
        codec.encode(torch.zeros(8, dtype=torch.int32), "onebit")
    with pytest.raises(squall.SquallInvalidArgument, match="torch.Tensor or a numpy"):
        codec.encode([1.0, 2.0], "onebit")
    wire = codec.encode(torch.zeros(100), "onebit")
    with pytest.raises(squall.SquallError):
        codec.decode(wire[:5])
    with pytest.raises(squall.SquallError):
        codec.decode(wire, out=torch.zeros(99))


def test_no_default_communicator():
    squall.set_default(None)
    with pytest.raises(squall.SquallInvalidUsage, match="squall.init"):
        squall.allreduce(torch.zeros(4))


def test_init_without_torch_distributed():
    with pytest.raises(squall.SquallInvalidUsage, match="init_process_group"):
        squall.init()


def test_single_rank_communicator_from_unique_id():
    with squall.Communicator.from_unique_id(squall.get_unique_id(), 1, 0, transport="tcp") as c:
        assert (c.rank, c.size, c.transport) == (0, 1, "tcp")
        x = torch.arange(5, dtype=torch.float32)
        assert torch.equal(c.allreduce(x.clone(), "sum"), x)
        comp = squall.Compressor(c, 5, "fp16")
        y = comp.allreduce(x.clone())
        assert torch.equal(y, x)
        assert comp.stats["calls"] == 1
    assert c.closed
    with pytest.raises(squall.SquallInvalidUsage, match="closed"):
        c.allreduce(x)
    with pytest.raises(squall.SquallInvalidArgument, match="128 bytes"):
        squall.Communicator.from_unique_id(b"short", 1, 0)
