#!/usr/bin/env bash
# One pass of the CUDA path on a lent GPU machine, inside a fixed time budget (seconds, $1, default 420):
# the GPU tests with native Triton, then the benches, most valuable first; every step's log goes to $OUT
# (or ./gpu-out). Packages the machine lacks travel as wheels in .whl/ (installed into /tmp/site).
# Usage: bash tools/bench/gpu_check.sh [budget_s] [steps...]   steps: env tests small engine dequant attention
set -u
budget=${1:-420}; shift || true
steps=${*:-env tests small engine dequant attention}
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PAGEDECK_TRITON_NATIVE=1 PAGEDECK_CPU_KERNELS=0
py=python3
if ls .whl/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
else
  export PYTHONPATH=$PWD
fi

step() {  # step NAME CAP command...: run with the smaller of CAP and what is left of the budget
  local name=$1 cap=$2; shift 2
  local left=$((budget - SECONDS - 5))
  [[ " $steps " == *" $name "* ]] || return 0
  if ((left < 20)); then echo "== $name: skipped (budget spent)"; return 0; fi
  ((cap > left)) && cap=$left
  echo "== $name (limit ${cap}s, at ${SECONDS}s)"
  timeout "$cap" "$@" > "$out/$name.log" 2>&1
  echo "== $name: exit $? after ${SECONDS}s"
  tail -n 40 "$out/$name.log"
}

step env 30 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; \
  $py -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, \
  torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count)'; lscpu | grep 'Model name'"
step tests 300 $py -m pytest -q -p no:cacheprovider --noconftest -m gpu tests/kernels/test_gpu.py -rs --durations=8
step small 90 $py -m engine bench --model smollm2-135m-random --peer transformers --repeats 3 --streams 8
step engine 150 $py -m engine bench --model llama3-8b-random --peer transformers --repeats 1 --streams 64
step dequant 60 $py -m tools.bench.dequant_bench --json "$out/dequant.json"
step attention 150 $py -m tools.bench.kernel_bench --quant none q8 q4 --json "$out/attention.json"
echo "== done at ${SECONDS}s"
