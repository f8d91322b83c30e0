"""SlowMo (pure Python over squall.allreduce): runs with any libsquall."""

import pytest
import torch

import _dist


def _grad(rank, step, p, salt):
    g = torch.Generator().manual_seed(100000 * salt + 1000 * rank + step)
    return torch.randn(p.shape, generator=g) + 0.1 * p.detach()


def _params():
    g = torch.Generator().manual_seed(7)
    return [torch.randn(10, 5, generator=g).requires_grad_(),
            torch.randn(7, generator=g).requires_grad_()]


def _groups(ps):
    return [{"params": [ps[0]], "lr": 0.1}, {"params": [ps[1]], "lr": 0.05}]


def _reference(world, steps, tau, alpha, beta):
    """All ranks simulated in one process with plain torch."""
    replicas = [_params() for _ in range(world)]
    opts = [torch.optim.SGD(_groups(ps), momentum=0.9) for ps in replicas]
    x_prev = [p.detach().clone() for p in replicas[0]]
    u = [torch.zeros_like(p) for p in x_prev]
    lrs = [0.1, 0.05]
    for s in range(steps):
        for r in range(world):
            for i, p in enumerate(replicas[r]):
                p.grad = _grad(r, s, p, i)
            opts[r].step()
        if (s + 1) % tau == 0:
            with torch.no_grad():
                for i in range(2):
                    avg = sum(replicas[r][i].detach() for r in range(world)) / world
                    u[i] = beta * u[i] + (x_prev[i] - avg) / lrs[i]
                    x_prev[i] = avg.clone() if (alpha == 1 and beta == 0) else \
                        x_prev[i] - u[i] * (alpha * lrs[i])
                    for r in range(world):
                        replicas[r][i].copy_(x_prev[i])
    return [p.detach() for p in replicas[0]]


def _slowmo_run(rank, steps, tau, alpha, beta, mode, codec="onebit"):
    from squall.optim import SlowMo

    ps = _params()
    if rank == 1:  # a different start: SlowMo broadcasts rank 0's parameters
        with torch.no_grad():
            ps[0].add_(1.0)
    opt = SlowMo(torch.optim.SGD(_groups(ps), momentum=0.9), tau=tau, alpha=alpha, beta=beta,
                 mode=mode, codec=codec)
    assert opt.param_groups[1]["lr"] == 0.05
    synced = []
    for s in range(steps):
        for i, p in enumerate(ps):
            p.grad = _grad(rank, s, p, i)
        opt.step()
        if (s + 1) % tau == 0:
            synced.append([p.detach().clone() for p in ps])
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in ps)
    return {"final": [p.detach().clone() for p in ps], "synced": synced}


def _slowmo_bad(rank):
    import squall
    from squall.optim import SlowMo

    with pytest.raises(squall.SquallInvalidArgument, match="tau"):
        SlowMo(torch.optim.SGD(_params(), lr=0.1), tau=0)
    with pytest.raises(squall.SquallInvalidArgument, match="mode"):
        SlowMo(torch.optim.SGD(_params(), lr=0.1), mode="fast")
    shape = (3,) if rank == 0 else (4,)
    with pytest.raises(squall.SquallInvalidUsage, match="differ across ranks"):
        SlowMo(torch.optim.SGD([torch.zeros(shape, requires_grad=True)], lr=0.1))
    return True


CONFIGS = [(1.0, 0.0, "full", "onebit"), (0.7, 0.5, "full", "onebit"),
           (1.0, 0.5, "compressed", "onebit"), (1.0, 0.5, "compressed", "int4"),
           (1.0, 0.5, "compressed", "int2")]


def _slowmo_worker(rank, world, steps, tau):
    import squall

    squall.init()
    out = [_slowmo_run(rank, steps, tau, *cfg) for cfg in CONFIGS]
    return out, _slowmo_bad(rank)


def test_slowmo_periodic_averaging_reference_and_bad_input():
    steps, tau, world = 9, 3, 2
    res = _dist.run(_slowmo_worker, world=world, args=(steps, tau))
    assert res[0][1] and res[1][1]  # bad input raised on both ranks
    distance = {}  # compressed: how far each codec's parameters end from full precision
    for k, (alpha, beta, mode, codec) in enumerate(CONFIGS):
        r0, r1 = res[0][0][k], res[1][0][k]
        # after every synchronisation all ranks hold bit-identical parameters
        for a, b in zip(r0["synced"], r1["synced"]):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), (alpha, beta, mode, codec)
        ref = _reference(world, steps, tau, alpha, beta)
        if mode == "compressed":
            distance[codec] = sum((got - want).norm() for got, want in zip(r0["final"], ref))
            continue
        for got, want in zip(r0["final"], ref):
            if alpha == 1.0 and beta == 0.0:
                assert torch.equal(got, want)  # exactly periodic averaging
            else:
                assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    # More bits per element, closer to the full-precision synchronisation.
    assert distance["int4"] < distance["int2"] < distance["onebit"], distance


def _slowmo_ckpt(rank, world, path, resume, mode="full", drop_residuals=False, streamed=False):
    import squall
    from squall.optim import SlowMo

    squall.init()
    ps = _params()
    # streamed: fragment 0's sync launched at step 6 is in flight at the checkpoint
    kw = {"fragments": 2, "delay": 1, "merge": "carry", "nesterov": True} if streamed else {}
    opt = SlowMo(torch.optim.AdamW(_groups(ps), weight_decay=0.01), tau=4, alpha=0.8, beta=0.5,
                 mode=mode, **kw)
    start = 0
    if resume:
        ck = torch.load(f"{path}.{rank}")
        with torch.no_grad():
            for p, v in zip(ps, ck["params"]):
                p.copy_(v)
        if drop_residuals:  # a state dict from before they were saved
            del ck["opt"]["slowmo"]["residuals"]
        opt.load_state_dict(ck["opt"])
        start = 6
    for s in range(start, 14):
        if s == 6 and not resume:
            torch.save({"params": [p.detach().clone() for p in ps], "opt": opt.state_dict()},
                       f"{path}.{rank}")
        for i, p in enumerate(ps):
            p.grad = _grad(rank, s, p, i)
        opt.step()
    return [p.detach().clone() for p in ps]


@pytest.mark.parametrize("mode,streamed", [("full", False), ("compressed", False),
                                           ("compressed", True)])
def test_slowmo_state_dict_resumes_bit_identically(tmp_path, mode, streamed):
    """Compressed: the residuals are in the state dict; resumed without them
    (an older state dict) the run goes elsewhere. Streamed: the sync in flight
    at the checkpoint is in it too, merged at its step after the resume."""
    path = str(tmp_path / "slowmo.pt")
    first = _dist.run(_slowmo_ckpt, world=2, args=(path, False, mode, False, streamed))
    again = _dist.run(_slowmo_ckpt, world=2, args=(path, True, mode, False, streamed))
    for a, b in zip(first, again):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    if mode == "compressed":
        lost = _dist.run(_slowmo_ckpt, world=2, args=(path, True, mode, True, streamed))
        assert not all(torch.equal(x, y) for x, y in zip(first[0], lost[0]))


def test_slowmo_single_rank_with_lr_scheduler():
    import squall
    from squall.optim import SlowMo

    with squall.Communicator.from_unique_id(squall.get_unique_id(), 1, 0, transport="tcp") as c:
        p = torch.ones(4, requires_grad=True)
        opt = SlowMo(torch.optim.SGD([p], lr=0.5), tau=2, alpha=1.0, beta=0.0, comm=c)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for _ in range(4):
            p.grad = torch.ones(4)
            opt.step()
            sched.step()
        # lr 0.5, 0.25, 0.125, 0.0625: one rank, so averaging changes nothing
        assert torch.allclose(p.detach(), torch.full((4,), 1 - 0.9375))
        assert opt.param_groups[0]["lr"] == 0.03125 and opt.steps == 4
        sd = opt.state_dict()
        assert sd["slowmo"]["steps"] == 4 and "base" in sd


def test_slowmo_default_beta_follows_the_period():
    import squall
    from squall.optim import SlowMo

    with squall.Communicator.from_unique_id(squall.get_unique_id(), 1, 0, transport="tcp") as c:
        def make(**kw):
            return SlowMo(torch.optim.SGD([torch.ones(4, requires_grad=True)], lr=0.5), comm=c,
                          **kw)
        plain = make()
        assert plain.beta == 0.5 and plain.tau == 12 and plain.mode == "compressed"
        assert make(tau=SlowMo.LONG_PERIOD - 1).beta == 0.5
        assert make(tau=SlowMo.LONG_PERIOD).beta == 0.0 and make(tau=250).beta == 0.0
        assert make(tau=250, beta=0.5).beta == 0.5 and make(tau=12, beta=0.0).beta == 0.0
        assert "beta=0.0" in repr(make(tau=100))


# ------------------------------------------------------------ streaming ----

def _units(fragments):
    """(tensor, first, end, fragment): _params()'s 57 elements in `fragments`
    equal runs, fragment f elements [57 f // F, 57 (f + 1) // F); at 2, the
    first tensor (50 elements) is cut after its 28th."""
    ends = [57 * (f + 1) // fragments for f in range(fragments)]
    units, before = [], 0
    for i, n in enumerate((50, 7)):
        a = 0
        while a < n:
            f = next(f for f, e in enumerate(ends) if before + a < e)
            b = min(n, ends[f] - before)
            units.append((i, a, b, f))
            a = b
        before += n
    return units


def _streamed_reference(world, steps, tau, alpha, beta, fragments, delay, merge, nesterov):
    """Streamed SlowMo, full precision, every rank simulated in one process."""
    replicas = [_params() for _ in range(world)]
    opts = [torch.optim.SGD(_groups(ps), momentum=0.9) for ps in replicas]
    units = _units(fragments)

    def part(r, k):  # unit k of rank r's parameters (a view)
        i, a, b, _ = units[k]
        return replicas[r][i].detach().view(-1)[a:b]

    x_prev = [part(0, k).clone() for k in range(len(units))]
    u = [torch.zeros_like(x) for x in x_prev]
    lrs = [0.1, 0.05]
    in_flight = []  # (unit, land, average, launched per rank)
    for s in range(1, steps + 1):
        for r in range(world):
            for i, p in enumerate(replicas[r]):
                p.grad = _grad(r, s - 1, p, i)
            opts[r].step()
        with torch.no_grad():
            for k, (_, _, _, f) in enumerate(units):
                if s % tau == tau * (f + 1) // fragments % tau:
                    avg = sum(part(r, k) for r in range(world)) / world
                    in_flight.append((k, s + delay, avg,
                                      [part(r, k).clone() for r in range(world)]))
            for k, land, avg, launched in [t for t in in_flight if t[1] <= s]:
                lr = lrs[units[k][0]]
                delta = x_prev[k] - avg
                u[k] = beta * u[k] + delta / lr
                if alpha == 1 and beta == 0:
                    x_prev[k] = avg.clone()
                elif nesterov:
                    x_prev[k] = x_prev[k] - alpha * (delta + beta * lr * u[k])
                else:
                    x_prev[k] = x_prev[k] - u[k] * (alpha * lr)
                for r in range(world):
                    keep = part(r, k) - launched[r] if merge == "carry" and delay > 0 else 0
                    part(r, k).copy_(x_prev[k] + keep)
            in_flight = [t for t in in_flight if t[1] > s]
    return [[p.detach() for p in ps] for ps in replicas]


STREAMED = [  # tau, alpha, beta, fragments, delay, merge, nesterov, mode
    (4, 1.0, 0.5, 2, 1, "replace", False, "full"),
    (4, 0.7, 0.9, 2, 2, "carry", True, "full"),
    (4, 1.0, 0.0, 2, 3, "carry", False, "full"),
    (3, 0.8, 0.5, 1, 0, "replace", True, "full"),
    (4, 1.0, 0.5, 2, 2, "replace", False, "compressed"),
    (4, 0.7, 0.9, 2, 1, "carry", True, "compressed"),
]


def _streamed_run(rank, world, steps):
    import squall
    from squall.optim import SlowMo

    squall.init()
    out = []
    for tau, alpha, beta, fragments, delay, merge, nesterov, mode in STREAMED:
        ps = _params()
        opt = SlowMo(torch.optim.SGD(_groups(ps), momentum=0.9), tau=tau, alpha=alpha, beta=beta,
                     mode=mode, fragments=fragments, delay=delay, merge=merge, nesterov=nesterov)
        launched, merged = [], []  # (step, fragment[, its parameters after the merge])

        def launch(piece, land, _launch=opt._launch):
            launched.append((opt.steps, piece.fragment))
            _launch(piece, land)

        def merge(t, _merge=opt._merge):
            _merge(t)
            merged.append((opt.steps, t.piece.fragment,
                           [p.detach().clone() for p in t.piece.params]))

        opt._launch, opt._merge = launch, merge
        for s in range(1, steps + 1):
            for i, p in enumerate(ps):
                p.grad = _grad(rank, s - 1, p, i)
            opt.step()
        sd = opt.state_dict()["slowmo"]
        out.append({"final": [p.detach().clone() for p in ps], "merged": merged,
                    "launched": launched,
                    "x_prev": sd["x_prev"], "bytes": opt.stats["bytes_sent"]})
    return out


def test_streamed_slowmo_against_reference_and_identical_merges():
    """Fragments sync at their own steps, each merge lands `delay` steps after
    its launch on every rank from the same bytes (bit-identical fragments with
    merge='replace', identical x_prev with 'carry'), and nothing is lost or
    applied twice (full precision: the single-process reference)."""
    steps, world = 13, 2
    res = _dist.run(_streamed_run, world=world, args=(steps,))
    for k, (tau, alpha, beta, fragments, delay, merge, nesterov, mode) in enumerate(STREAMED):
        r0, r1 = res[0][k], res[1][k]
        # every fragment launches at its own steps and merges `delay` steps later
        offsets = [tau * (f + 1) // fragments % tau for f in range(fragments)]
        launched = sorted(set(r0["launched"]))  # (step, fragment), a piece per group in it
        assert launched == [(s, f) for s in range(1, steps + 1)
                            for f in range(fragments) if s % tau == offsets[f]]
        assert sorted({m[:2] for m in r0["merged"]}) == [(s + delay, f) for s, f in launched
                                                         if s + delay <= steps]
        assert [m[:2] for m in r0["merged"]] == [m[:2] for m in r1["merged"]]
        if merge == "replace" or delay == 0:
            for a, b in zip(r0["merged"], r1["merged"]):
                assert all(torch.equal(x, y) for x, y in zip(a[2], b[2])), STREAMED[k]
        for a, b in zip(r0["x_prev"], r1["x_prev"]):
            assert torch.equal(a, b), STREAMED[k]
        assert r0["bytes"] > 0
        if mode == "compressed":
            continue
        ref = _streamed_reference(world, steps, tau, alpha, beta, fragments, delay, merge,
                                  nesterov)
        for r in range(world):
            for got, want in zip(res[r][k]["final"], ref[r]):
                assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (STREAMED[k], r)


def _streamed_bad(rank, world):
    import squall
    from squall.optim import SlowMo

    squall.init()
    sgd = torch.optim.SGD(_params(), lr=0.1)
    for kwargs, what in (({"tau": 4, "fragments": 5}, "fragments"),
                         ({"tau": 4, "fragments": 0}, "fragments"),
                         ({"tau": 4, "delay": 4}, "delay"),
                         ({"tau": 4, "delay": -1}, "delay"),
                         ({"merge": "average"}, "merge")):
        with pytest.raises(squall.SquallInvalidArgument, match=what):
            SlowMo(sgd, **kwargs)
    with pytest.raises(squall.SquallInvalidUsage, match="settings differ"):
        SlowMo(sgd, tau=4, delay=rank)
    return True


def test_streamed_slowmo_bad_settings():
    assert _dist.run(_streamed_bad, world=2) == [True, True]


def _stops_mid_sync(rank, world):
    import time

    import squall
    from squall.optim import SlowMo

    squall.init(timeout=2)
    ps = _params()
    opt = SlowMo(torch.optim.SGD(_groups(ps), momentum=0.9), tau=4, fragments=2, delay=2)
    start = None
    try:
        for s in range(1, 9):
            if rank == 2 and s == 2:
                time.sleep(6)  # alive, but never joins fragment 0's sync (launched at step 2)
                return None
            for i, p in enumerate(ps):
                p.grad = _grad(rank, s - 1, p, i)
            if s == 4:  # the sync launched at step 2 lands now
                start = time.monotonic()
            opt.step()
    except squall.SquallError as e:
        after = [p.detach().clone() for p in ps]
        return {"error": f"{type(e).__name__}: {e}", "step": s,
                "seconds": time.monotonic() - start}
    return {"error": None}


def test_a_rank_missing_a_streamed_sync_fails_every_rank_within_the_timeout():
    results = _dist.run(_stops_mid_sync, world=3, timeout=60)
    for r in results[:2]:
        assert r["error"] is not None, r
        # the rank that timed out names rank 2; the others hear it from that rank
        assert r["error"].startswith(("SquallTimeout", "SquallRemoteError")), r
        assert "rank(s) 2" in r["error"], r
        assert r["step"] == 4, r  # where the sync lands, not later
        assert r["seconds"] < 2 + 4, r


def _diverges(rank, world, mode):
    import warnings

    import squall
    from squall.optim import SlowMo

    squall.init()
    ps = _params()
    opt = SlowMo(torch.optim.SGD(_groups(ps), momentum=0.9), tau=2, mode=mode)
    start = [p.detach().clone() for p in ps]  # x_prev: rank 0's, broadcast
    for s in range(1, 3):
        for i, p in enumerate(ps):
            p.grad = _grad(rank, s - 1, p, i)
        if rank == 1 and s == 2:
            ps[0].grad[0, 0] = float("nan")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
    return {"params": [p.detach().clone() for p in ps], "start": start,
            "skipped": opt.skipped_syncs, "warned": [str(w.message) for w in caught]}


@pytest.mark.parametrize("mode", ["full", "compressed"])
def test_a_non_finite_average_is_skipped_on_every_rank(mode):
    """Rank 1 diverges: every rank gets the same non-finite average, applies
    none of it, and goes back to the last synchronised values (group 0; group
    1's average is finite and applied)."""
    r0, r1 = _dist.run(_diverges, world=2, args=(mode,))
    for r in (r0, r1):
        assert r["skipped"] == 1 and any("not finite" in w for w in r["warned"]), r
        assert torch.equal(r["params"][0], r0["start"][0])
        assert not torch.equal(r["params"][1], r0["start"][1])
    assert all(torch.equal(a, b) for a, b in zip(r0["params"], r1["params"]))


def test_fragments_are_equal_runs_that_cut_large_tensors():
    """Streamed fragments are equal runs of the parameters' elements: a
    tensor holding most of them is cut across fragments, as views that write
    through to it, so no fragment's sync is larger than its share (whole
    tensors left one fragment with 4.2 M of an MLP's 6.3 M parameters)."""
    import squall
    from squall.optim import SlowMo

    with squall.Communicator.from_unique_id(squall.get_unique_id(), 1, 0, transport="tcp") as c:
        big = torch.zeros(100, 30, requires_grad=True)
        small = torch.zeros(10, requires_grad=True)
        opt = SlowMo(torch.optim.SGD([big, small], lr=0.1), tau=4, fragments=4, comm=c)
        sizes = [sum(p.numel for p in opt._pieces if p.fragment == f) for f in range(4)]
        assert sizes == [752, 753, 752, 753], sizes  # 3010 elements
        first = opt._pieces[0].params[0]
        with torch.no_grad():
            first.fill_(1.0)
        assert big.view(-1)[:752].eq(1).all() and big.view(-1)[752:].eq(0).all()
        assert opt._pieces[-1].params[-1] is small  # the last run ends with it, whole
