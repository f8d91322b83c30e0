#!/bin/bash
# settings x repeats, interleaved; each launch: 2 ranks, 1gbit
cd /work/main
M="MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736"
for rep in 0 1; do
  for s in "never|" "auto|" "never|$M" "auto|$M"; do
    stores=${s%%|*}; malloc=${s#*|}
    tag=$stores-$([ -n "$malloc" ] && echo tuned || echo default)
    env -u SQUALL_LIBRARY SQUALL_STREAM_STORES=$stores $malloc python3 perf/fsdp/step.py --python build/venv-torch/bin/python \
      --ranks 2 --rates 1gbit --repeats 1 --variants fp32 squall squall_int4_params_inline compute \
      --out /tmp/fsdpcmp/$tag/rep$rep 2>&1 | grep "step median\|repeat"
  done
done
