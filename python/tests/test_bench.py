"""perf/bench.py, the benchmarks' front door: every subcommand parses, a
cheap measurement (the codec at a tiny size, the allreduce on loopback at
2 ranks and small sizes) writes a valid run record, a committed record is
what its raw files give, and `plots` renders from a small record."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "perf", "bench.py")
LIB = os.environ.get("SQUALL_LIBRARY", os.path.join(ROOT, "build", "src", "core", "libsquall.so"))
BUILD = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(LIB))))

spec = importlib.util.spec_from_file_location("bench", BENCH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
C = bench.C

SUBCOMMANDS = {
    "codec": ["--summary", "--impl", "avx2,avx512", "--threads", "1", "2"],
    "allreduce": ["--ranks", "2,4", "-b", "1M", "-e", "4M", "--variant", "t2:SQUALL_CODEC_THREADS=2"],
    "links": ["--rates", "1gbit", "10gbit", "--ranks", "2", "--repeats", "3", "--no-bound"],
    "load": ["--builds", "a=build", "b=build-old", "--ucx", "2:1gbit", "--fp32-max", "64M"],
    "hier": ["--sizes", "64M", "--rates", "100mbit", "--per-host", "2"],
    "peers": ["--link", "1gbit", "10gbit", "--libs", "squall,gloo", "--ranks", "4"],
    "nccl-net": ["--rates", "1gbit", "--conns", "1,4"],
    "nccl-collnet": ["--codecs", "none", "bf16", "--ranks", "2"],
    "ddp-hooks": ["--rates", "100mbit", "--hooks", "ddp", "onebit", "--steps", "24", "-w", "4"],
    "ddp-quality": ["--steps", "10", "--seeds", "0", "--families", "mlp"],
    "horovod": ["--rates", "1gbit", "--ranks", "2", "--hidden", "1024"],
    "convergence": ["--from", "perf/convergence/results"],
    "plots": ["a.json", "--out", "img"],
    "gpu-codec": ["-b", "1M", "-e", "16M", "--block", "2048", "--repeats", "3"],
    "gpu-allreduce": ["--repeats", "2"],
}


def run_bench(args, timeout=50):
    p = subprocess.run([sys.executable, BENCH] + args, capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT, env=dict(os.environ, SQUALL_TRANSPORT="tcp", SQUALL_SOCKET_IFNAME="lo"))
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_every_subcommand_parses():
    p = bench.parser()
    names = set(p._subparsers._group_actions[0].choices)
    assert names == set(SUBCOMMANDS) | {"bound"}, names ^ set(SUBCOMMANDS)
    for name, argv in SUBCOMMANDS.items():
        args = p.parse_args([name] + argv)
        assert callable(args.func), name
        with pytest.raises(SystemExit) as e:
            p.parse_args([name, "-h"])
        assert e.value.code == 0, name
    args = p.parse_args(["links", "--rates", "1gbit,10gbit", "100mbit", "--ranks", "2", "4,8"])
    assert bench.listed(args.rates) == ["1gbit", "10gbit", "100mbit"]
    assert bench.listed(args.ranks, int) == [2, 4, 8]
    args = p.parse_args(["convergence", "--out", "o", "--", "--doc", "--seeds", "1"])
    assert args.study_args[-3:] == ["--doc", "--seeds", "1"]
    # bound takes bound.py's own options: its help is bound.py's
    assert "--codec-shared" in run_bench(["bound", "-h"]).stdout


def test_validate_rejects_a_row_whose_summary_does_not_match():
    rec = C.Record("allreduce", {}, ["allreduce"])
    rec.add("squall onebit", {"bytes": 1024}, "time", "ms", [3.0, 1.0, 2.0])
    data = json.loads(json.dumps(rec.data))
    assert C.validate(data)["rows"][0]["median"] == 2.0
    data["rows"][0]["median"] = 1.5
    with pytest.raises(ValueError, match="median"):
        C.validate(data)
    with pytest.raises(ValueError, match="squall-bench"):
        C.validate({"rows": []})


def _built(tool):
    path = os.path.join(BUILD, "perf", tool)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not built (ninja -C {BUILD} perf/{tool})")
    return path


def test_codec_at_a_tiny_size_writes_a_record(tmp_path):
    _built("codec_bench")
    run_bench(["codec", "--build", BUILD, "-b", "64K", "--iters", "1", "--repeats", "2",
               "--impl", "scalar", "--out", str(tmp_path)])
    data = C.load(tmp_path / "bench.json")
    assert data["bench"] == "codec"
    kernels = {r["cell"]["kernel"] for r in data["rows"]}
    assert kernels == {"encode+EF", "decode", "accumulate", "encode+EF stream", "decode stream",
                       "sum2 separate", "sum2 fused", "encode+EF bf16"}
    assert {r["cell"]["codec"] for r in data["rows"]} == {"onebit", "int2", "int4", "int8"}
    for r in data["rows"]:
        assert r["cell"]["elements"] == 64 << 10 and r["unit"] == "elements/s"
        assert len(r["values"]) == 2 and r["min"] > 0
    assert (tmp_path / "codec_1.json").exists() and (tmp_path / "codec_2.json").exists()


def test_allreduce_on_loopback_writes_a_record(tmp_path):
    _built("squall_perf")
    run_bench(["allreduce", "--build", BUILD, "--ranks", "2", "-b", "64K", "-e", "256K", "-f", "4",
               "-n", "2", "-w", "1", "--repeats", "2", "--transport", "tcp", "--out", str(tmp_path)])
    data = C.load(tmp_path / "bench.json")
    assert data["bench"] == "allreduce" and data["command"].startswith("perf/bench.py allreduce")
    cells = {(r["series"], r["cell"]["bytes"]): r for r in data["rows"]}
    assert set(cells) == {(s, b) for s in ("squall onebit", "squall fp32 ring") for b in (64 << 10, 256 << 10)}
    for r in cells.values():
        assert r["cell"]["ranks"] == 2 and r["unit"] == "ms" and len(r["values"]) == 2 and r["min"] > 0
    assert cells[("squall onebit", 256 << 10)]["extra"]["wire_bytes"] < (256 << 10) / 8


def test_committed_links_record_is_what_its_raw_files_give(tmp_path):
    src = os.path.join(ROOT, "perf", "results", "links-idle")
    run_bench(["links", "--from", src, "--out", str(tmp_path)])
    with open(os.path.join(src, "bench.json")) as f:
        committed = C.validate(json.load(f))
    assert C.load(tmp_path / "bench.json")["rows"] == committed["rows"]


def test_plots_render_from_a_small_record(tmp_path):
    # The plots need matplotlib in the interpreter running the suite (Debian's
    # python3-matplotlib; a venv with only torch has none).
    pytest.importorskip("matplotlib")
    def record(bench_name, rows):
        rec = C.Record(bench_name, {}, [bench_name])
        for r in rows:
            rec.add(*r)
        path = tmp_path / f"{bench_name}.json"
        path.write_text(json.dumps(rec.data))
        return str(path)

    paths = [
        record("links", [(s, {"link": link, "ranks": 2, "bytes": 1 << 28}, "time", "ms", v)
                         for link in ("1gbit", "10gbit")
                         for s, v in (("squall onebit", [150, 152, 149]), ("squall fp32 ring", [2165, 2170]),
                                      ("bound max(wire, codec)", [125.6]))]),
        record("peers", [("gloo", {"link": "1gbit", "ranks": 2, "bytes": 1 << 28, "type": "float",
                                   "op": "sum"}, "time", "us", [2.4e6, 2.5e6])]),
        record("ddp-hooks", [(h, {"hook": h, "link": link}, "step", "ms", [600, 700])
                             for h in ("plain DDP (gloo fp32)", "Squall onebit hook")
                             for link in ("100mbit", "1gbit")]),
        record("convergence", [(m, {"task": "digits", "steps": 300, "world": 4}, metric, unit, v)
                               for m in ("adam", "apmsqueeze")
                               for metric, unit, v in (("test_loss", "loss", [0.18, 0.17]),
                                                       ("sent_per_rank", "bytes", [1.7e7, 1.8e7]))]),
    ]
    out = tmp_path / "img"
    run_bench(["plots"] + paths + ["--out", str(out)])
    for name in ("allreduce_vs_link.png", "ddp_hooks.png", "loss_vs_bytes.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_gpu_outputs_become_rows():
    # Lines as gpu_codec_bench and gpu_allreduce_bench print them; no GPU is needed to parse.
    codec = ("GPU: NVIDIA H200, block 2048, median of 7 runs\n"
             "cudaMemcpy D2D fp32                n=16777216     0.040 ms   3355.4 GB/s  (reference)\n"
             "encode+EF onebit fp32              n=16777216     0.070 ms   2900.0 GB/s   95.0% of copy bound\n")
    rec = C.Record("gpu-codec", {}, ["gpu-codec"])
    bench.gpu_codec_rows(rec, [codec, codec.replace("0.070 ms", "0.080 ms")])
    rows = {r["series"]: r for r in rec.data["rows"]}
    assert rows["encode+EF onebit fp32"]["values"] == [0.07, 0.08]
    assert rows["cudaMemcpy D2D fp32"]["cell"] == {"elements": 16777216}
    ar = "BENCH n=2 count=16777216 (64 MiB fp32): compressed onebit    1.500 ms, ncclAllReduce    3.000 ms, ratio 2.00x\n"
    rec = C.Record("gpu-allreduce", {}, ["gpu-allreduce"])
    bench.gpu_allreduce_rows(rec, [ar])
    C.validate(rec.data)
    assert [(r["series"], r["cell"]["bytes"], r["median"]) for r in rec.data["rows"]] == [
        ("squall onebit (device buffers)", 64 << 20, 1.5), ("ncclAllReduce", 64 << 20, 3.0)]


def test_bound_on_saved_files_writes_a_record(tmp_path):
    src = os.path.join(ROOT, "perf", "results", "links-idle")
    runs = [os.path.join(src, f"1gbit_n2_{i}.json") for i in (1, 2, 3)]
    p = run_bench(["bound", "--codec", os.path.join(src, "codec_1.json"), "--out", str(tmp_path)] + runs
                  + ["--project", "25gbit"])
    assert "all targets met" in p.stdout
    data = C.load(tmp_path / "bench.json")
    bounds = [r for r in data["rows"] if r["series"] == "bound max(wire, codec)"]
    assert {r["cell"]["bytes"] for r in bounds} == {64 << 20, 256 << 20}
    assert any(r["series"] == "projected bound" and r["cell"]["link"] == "25gbit (projected)"
               for r in data["rows"])
