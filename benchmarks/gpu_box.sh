#!/usr/bin/env bash
# The many-core GPU box run, in one call (issue 12's 16-core targets; docs/performance.md):
#   bash benchmarks/gpu_box.sh [OUT_DIR]
# 1. builds the 5,000-image set (benchmarks/_data/photos must hold the source photographs,
#    fetched once by `python benchmarks/_imagedata.py` where pip reaches a registry);
# 2. ResNet-50 training fed by every loader (bench_gpu_train.py), quick step counts;
# 3. the loaders alone with an idle and a GIL-holding consumer (bench_gil.py).
# Each part has a time limit, so the run ends inside a lease; results are copied to OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-benchmarks/results}}
mkdir -p "$OUT_DIR" benchmarks/results
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
echo "== machine"; nproc; free -g | head -2; df -h /dev/shm | tail -1
nvidia-smi -L 2>/dev/null
$PY -c "import sys, torch, PIL; print('python', sys.version.split()[0], 'torch', torch.__version__, 'PIL', PIL.__version__, 'cuda', torch.cuda.is_available())"
echo "== data"; time $PY benchmarks/_imagedata.py 5000
echo "== training"
timeout "${TRAIN_S:-300}" $PY benchmarks/bench_gpu_train.py --images 5000 --steps "${STEPS:-30}" \
    --warmup "${WARMUP:-10}" ${TRAIN_ONLY:+--only $TRAIN_ONLY}
cp benchmarks/results/bench_gpu_train.* "$OUT_DIR"/ 2>/dev/null
echo "== loaders alone"
timeout "${GIL_S:-140}" $PY benchmarks/bench_gil.py --images 2000 --ms "${GIL_MS:-15,0}" \
    --epochs 1 --repeat 1
cp benchmarks/results/bench_gil.* "$OUT_DIR"/ 2>/dev/null
echo "== left behind"; ls /dev/shm | head; ps -eo pid,comm | grep -c python
