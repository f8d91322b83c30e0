"""The compressed reduce-scatter from Python (squall.Compressor(kind="reduce_scatter")),
two ranks as processes: bit for bit against a reference built with squall.codec,
the same bytes run to run, wire bytes against the formula, the non-finite rule,
numpy and half-precision buffers, async, and the refusals; and the quantized
all-gather (kind="all_gather") against the same codec round trips."""

import numpy as np
import pytest
import torch

import _dist

CODECS = ("onebit", "onebit:block=64:scale=rms", "int2:block=64", "int4:block=256", "int8",
          "fp16", "bf16", "none")


def _inputs(world, numel, call):
    """Every rank's input of call `call` (each rank can make all of them)."""
    return [torch.randn(numel, generator=torch.Generator().manual_seed(1000 * call + 10 * j + 1))
            for j in range(world)]


class _Reference:
    """The contract with squall.codec: rank j encodes piece c of its input on its
    own with its residual of that piece; rank r decodes the pieces r of every
    rank in rank order, summing, and divides by the group size for avg."""

    def __init__(self, world, recvcount, codec):
        import squall

        self.codec, self.recvcount, self.world = codec, recvcount, world
        self.residuals = [[squall.codec.Residual(recvcount) for _ in range(world)]
                          for _ in range(world)]

    def run(self, inputs, rank, avg):
        import squall

        r = self.recvcount
        wires = [[squall.codec.encode(inputs[j][c * r:(c + 1) * r], self.codec,
                                      residual=self.residuals[j][c])
                  for c in range(self.world)] for j in range(self.world)]
        out = np.zeros(r, dtype=np.float32)
        for j in range(self.world):
            squall.codec.decode(wires[j][rank], out, accumulate=j != 0)
        return out / np.float32(self.world) if avg else out


def _bits(x):
    a = x.numpy() if isinstance(x, torch.Tensor) else x
    return a.view(np.uint32)


def _against_reference(rank, world):
    import squall

    comm = squall.init(timeout=30)
    report = {}
    for codec in CODECS:
        for recvcount in (1000, 2049):  # below a 2048 block, and just past one
            numel = recvcount * world
            c = squall.Compressor(comm, numel, codec, kind="reduce_scatter")
            ref = _Reference(world, recvcount, codec)
            for call, op in enumerate(("avg", "sum", "avg")):
                inputs = _inputs(world, numel, call)
                out = torch.empty(recvcount)
                assert c.reduce_scatter(inputs[rank], out, op) is out
                want = ref.run(inputs, rank, op == "avg")
                assert np.array_equal(_bits(out), _bits(want)), (codec, recvcount, call)
            assert c.stats["calls"] == 3 and c.stats["skipped_calls"] == 0
            c.close()
    # the same bytes run to run: a fresh compressor over the same calls
    runs = []
    for _ in range(2):
        c = squall.Compressor(comm, 6000, "int4:block=256", kind="reduce_scatter")
        outs = [c.reduce_scatter(_inputs(world, 6000, k)[rank], torch.empty(3000))
                for k in range(3)]
        runs.append(torch.cat(outs))
    assert torch.equal(runs[0], runs[1])
    # 'none' keeps fp32: the average of identical inputs is the input
    x = torch.randn(4000, generator=torch.Generator().manual_seed(5))
    c = squall.Compressor(comm, 4000, "none", kind="reduce_scatter")
    out = c.reduce_scatter(x, torch.empty(2000))
    assert torch.equal(out, x[rank * 2000:(rank + 1) * 2000])
    # wire bytes: (n - 1)/n * numel * (bits/8 + 4/B), headers and a verdict byte aside
    for codec, bits, block in (("onebit", 1, 2048), ("int4:block=256", 4, 256)):
        numel = 1 << 18
        c = squall.Compressor(comm, numel, codec, kind="reduce_scatter")
        c.reduce_scatter(torch.randn(numel), torch.empty(numel // world))
        formula = (world - 1) / world * numel * (bits / 8 + 4 / block)
        st = c.stats
        report[codec] = (st["last_bytes_sent"], formula)
        assert abs(st["last_bytes_sent"] / formula - 1) < 0.02, (codec, st, formula)
        assert st["bytes_sent"] >= st["last_bytes_sent"]  # the communicator's own count
    # numpy arrays, fp16 tensors, async
    a = np.full(2 * world, rank + 1.0, dtype=np.float32)
    o = np.zeros(2, dtype=np.float32)
    c = squall.Compressor(comm, 2 * world, "onebit", kind="reduce_scatter")
    assert c.reduce_scatter(a, o, "sum") is o and (o == world * (world + 1) / 2).all()
    h = torch.full((3000 * world,), float(rank + 1), dtype=torch.float16)
    ho = torch.empty(3000, dtype=torch.float16)
    c = squall.Compressor(comm, 3000 * world, "int8", kind="reduce_scatter")
    req = c.reduce_scatter(h, ho, "avg", async_op=True)
    assert req.wait() is ho and (ho == (world + 1) / 2).all()
    return report


def test_reduce_scatter_matches_the_codec_reference():
    res = _dist.run(_against_reference, world=2, timeout=180)
    print({k: v for k, v in res[0].items()})


def _non_finite(rank, world):
    import squall

    comm = squall.init(timeout=30)
    recvcount, numel = 300, 300 * world
    c = squall.Compressor(comm, numel, "onebit:block=64", kind="reduce_scatter")
    ref = _Reference(world, recvcount, "onebit:block=64")
    for call in range(3):
        inputs = _inputs(world, numel, call)
        if call == 1:
            inputs[1][70] = float("nan")  # rank 1's piece 0, block 1: served by rank 0
        out = c.reduce_scatter(inputs[rank], torch.empty(recvcount))
        poisoned = torch.zeros(recvcount, dtype=torch.bool)
        if call == 1 and rank == 0:
            poisoned[64:128] = True
        assert torch.equal(torch.isnan(out), poisoned), call
        if call != 1:
            # The reference leaves the bad call out: it must not move any residual.
            want = ref.run(inputs, rank, True)
            assert np.array_equal(_bits(out), _bits(want)), call
    # every rank kept its residual for the bad call, not only the one that saw the NaN
    return c.stats["skipped_calls"]


def test_non_finite_input_gives_nan_and_every_rank_skips():
    assert _dist.run(_non_finite, world=2) == [1, 1]


def _refusals(rank, world):
    import squall

    comm = squall.init(timeout=30)
    with pytest.raises(squall.SquallInvalidArgument, match="not a multiple of 2"):
        squall.Compressor(comm, 1001, "onebit", kind="reduce_scatter")
    with pytest.raises(squall.SquallInvalidArgument, match="kind"):
        squall.Compressor(comm, 1000, "onebit", kind="allgather")
    rs = squall.Compressor(comm, 1000, "onebit", kind="reduce_scatter")
    ar = squall.Compressor(comm, 1000, "onebit")
    assert "reduce_scatter" in repr(rs)
    with pytest.raises(squall.SquallInvalidUsage, match="made for the reduce-scatter"):
        rs.allreduce(torch.zeros(1000))
    with pytest.raises(squall.SquallInvalidUsage, match="made for the allreduce"):
        ar.reduce_scatter(torch.zeros(1000), torch.zeros(500))
    with pytest.raises(squall.SquallInvalidArgument, match="output of 500"):
        rs.reduce_scatter(torch.zeros(1000), torch.zeros(1000))
    with pytest.raises(squall.SquallInvalidArgument, match="input's dtype"):
        rs.reduce_scatter(torch.zeros(1000), torch.zeros(500, dtype=torch.float16))
    with pytest.raises(squall.SquallInvalidArgument, match="unknown or unsupported reduction"):
        rs.reduce_scatter(torch.zeros(1000), torch.zeros(500), op="max")
    # still in step
    out = rs.reduce_scatter(torch.full((1000,), float(rank)), torch.empty(500), "sum")
    return float(out[0])


def test_refusals_are_clear_and_leave_the_ranks_in_step():
    assert _dist.run(_refusals, world=2) == [1.0, 1.0]


def _resume(rank, world):
    import squall

    comm = squall.init(timeout=30)
    numel = 600 * world
    for kind in ("allreduce", "reduce_scatter"):
        def call(c, k):
            x = _inputs(world, numel, k)[rank]
            if kind == "allreduce":
                return c.allreduce(x.clone())
            return c.reduce_scatter(x, torch.empty(numel // world))

        a = squall.Compressor(comm, numel, "int4:block=64", kind=kind)
        for k in range(3):
            call(a, k)
        state = a.save_state()
        went_on = call(a, 3)
        fresh = squall.Compressor(comm, numel, "int4:block=64", kind=kind)
        assert not torch.equal(call(fresh, 3), went_on)  # the residual matters here
        b = squall.Compressor(comm, numel, "int4:block=64", kind=kind)
        # a uint8 tensor, as torch.save / torch.load may hand it back
        b.load_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
        with pytest.raises(squall.SquallCorruptData, match="checksum"):
            b.load_state(state[:40] + bytes([state[40] ^ 1]) + state[41:])
        other = squall.Compressor(comm, numel, "int8:block=64", kind=kind)
        with pytest.raises(squall.SquallInvalidArgument, match="make the compressor with the"):
            other.load_state(state)
        assert torch.equal(call(b, 3), went_on)
    return 1


def test_a_saved_state_resumes_bit_for_bit():
    assert _dist.run(_resume, world=2) == [1, 1]


def _all_gather(rank, world):
    import squall

    comm = squall.init(timeout=30)
    numel = 1001
    xs = _inputs(world, numel, 5)
    want = np.concatenate([squall.codec.decode(squall.codec.encode(x, "int8:block=256"))
                           for x in xs])
    c = squall.Compressor(comm, numel, "int8:block=256", kind="all_gather")
    out = c.all_gather(xs[rank], torch.empty(world * numel))
    assert np.array_equal(_bits(out), _bits(want))
    inplace = torch.full((world * numel,), float("nan"))
    inplace[rank * numel:(rank + 1) * numel] = xs[rank]
    c.all_gather(inplace[rank * numel:(rank + 1) * numel], inplace)  # a view of the output
    assert np.array_equal(_bits(inplace), _bits(want))
    half = c.all_gather(xs[rank].bfloat16(), torch.empty(world * numel, dtype=torch.bfloat16))
    want_half = torch.cat([torch.as_tensor(squall.codec.decode(squall.codec.encode(
        x.bfloat16(), "int8:block=256"))).bfloat16() for x in xs])
    assert torch.equal(half, want_half)
    with pytest.raises(squall.SquallInvalidArgument, match="an output of"):
        c.all_gather(xs[rank], torch.empty(numel))
    with pytest.raises(squall.SquallInvalidUsage, match="made for"):
        squall.Compressor(comm, numel, "int8").all_gather(xs[rank], out)
    with pytest.raises(squall.SquallInvalidArgument, match="compressed code"):
        squall.Compressor(comm, numel, "none", kind="all_gather")
    stats = c.stats
    assert stats["calls"] == 3 and stats["bytes_sent"] > 0, stats
    return stats["bytes_sent"]


def test_all_gather_decodes_every_ranks_encoding():
    """The quantized all-gather (kind="all_gather"): every rank ends with every
    rank's codec round trip, in and out of place, bf16 too; refusals."""
    sent = _dist.run(_all_gather, world=2, timeout=120)
    import squall
    # three calls, each one encoding to the one peer
    assert sent[0] == 3 * squall.codec.encoded_size("int8:block=256", 1001), sent
