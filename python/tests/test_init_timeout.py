"""A rank that does not call squall.init (or a collective) makes every rank
that did fail within the communicator's timeout, naming the missing ranks;
nothing waits forever."""

import time

import _dist


def _skip_init(rank, world, skipper):
    import squall

    if rank == skipper:
        time.sleep(5)  # alive, in the process group, but never in squall.init
        return None
    start = time.monotonic()
    try:
        squall.init(timeout=2)
    except squall.SquallTimeout as e:
        return {"error": str(e), "seconds": time.monotonic() - start}
    return {"error": None}


def test_a_rank_that_skips_init_is_named_within_the_timeout():
    for skipper in (1, 0):  # the unique id's owner, or one of the others
        results = _dist.run(_skip_init, world=3, args=(skipper,), timeout=60)
        for rank, r in enumerate(results):
            if rank == skipper:
                continue
            assert r["error"] is not None, r
            assert f"rank {skipper} of the world did not call squall.init within 2 s" in \
                r["error"], r["error"]
            assert "Usual causes" in r["error"]
            assert r["seconds"] < 2 + 5, r


def _skip_collective(rank, world):
    import torch

    import squall

    comm = squall.init(timeout=2)
    if rank == 1:
        time.sleep(5)
        return None
    start = time.monotonic()
    try:
        comm.allreduce(torch.ones(1000))
    except squall.SquallTimeout as e:
        return {"error": str(e), "seconds": time.monotonic() - start}
    return {"error": None}


def test_a_rank_that_skips_a_collective_is_named_within_the_timeout():
    results = _dist.run(_skip_collective, world=2, timeout=60)
    r = results[0]
    assert r["error"] is not None and "rank(s) 1" in r["error"], r
    assert r["seconds"] < 2 + 5, r


def _init_twice(rank, world):
    import squall

    first = squall.init(timeout=10)
    second = squall.init(timeout=10)  # the n-th call meets the others' n-th
    return (first.size, second.size)


def test_repeated_init_meets_the_same_call_on_every_rank():
    assert _dist.run(_init_twice, world=2, timeout=60) == [(2, 2), (2, 2)]
