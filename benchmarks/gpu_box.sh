#!/usr/bin/env bash
# The many-core GPU box run (docs/performance.md), in calls that each fit a lease:
#   bash benchmarks/gpu_box.sh check [OUT_DIR]   # CUDA tests, then the GPU decoders side by side
#   bash benchmarks/gpu_box.sh train [OUT_DIR]   # training fed by each loader (issue 22's windows)
#   bash benchmarks/gpu_box.sh all [OUT_DIR]     # every part (TESTS_K narrows the tests: pytest -k)
#   bash benchmarks/gpu_box.sh lean [OUT_DIR]    # the CPU path's memory and one-thread kernel
#   bash benchmarks/gpu_box.sh session [OUT_DIR] # CUDA tests, training, lean: one lease's call
#   PARTS="tests cuda-tests memory train" bash benchmarks/gpu_box.sh parts [OUT_DIR]
#                                                # the named parts, in that order (names below)
# Wheels in .whl/ (nvImageCodec, nvJPEG, simplejpeg and pytest-asyncio, for a box that reaches no registry) are installed
# first. The 10,000-image set is built from benchmarks/_data/photos (fetched once by
# `python benchmarks/_imagedata.py` where pip reaches a registry). Each part has a time
# limit, so the run ends inside a lease; results are copied to OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:-check}
OUT_DIR=${2:-${OUT:-benchmarks/results}}
mkdir -p "$OUT_DIR" benchmarks/results
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
echo "== machine"; nproc; free -g | head -2; nvidia-smi -L 2>/dev/null
$PY -c "import sys, torch, PIL; print('python', sys.version.split()[0], 'torch', torch.__version__, 'PIL', PIL.__version__, 'cuda', torch.cuda.is_available())"
$PY -c "from asyncflow.image import _gpu_decoders as g; print('GPU decoders:', g.available())"
echo "== data"; time timeout 120 $PY benchmarks/_imagedata.py 10000
part_tests() {  # the CUDA tests of the GPU decode path (the box's pytest, no pytest-asyncio)
    echo "== CUDA tests"
    timeout "${TESTS_S:-200}" $PY -m pytest -c benchmarks/gpu_pytest.ini --rootdir . -q -rs \
        -p no:cacheprovider -m gpu ${TESTS_K:+-k "$TESTS_K"} tests/image/test_gpu_cuda.py \
        tests/image/test_folder_gpu.py 2>&1 | tee "$OUT_DIR/gpu_tests.log" | tail -40
}
part_cuda_tests() {  # every other test marked gpu, under the project's own pytest settings
    echo "== the other CUDA tests (pytest-asyncio carried in .whl/)"
    $PY -c "import pytest_asyncio" 2>/dev/null || { echo "skipped: no pytest_asyncio"; return; }
    files=$(grep -l "mark.gpu" tests/*/test_*.py | grep -v "test_gpu_cuda.py\|test_folder_gpu.py")
    # shellcheck disable=SC2086
    timeout "${CUDA_TESTS_S:-150}" $PY -m pytest -q -rs -p no:cacheprovider -m gpu $files 2>&1 \
        | tee "$OUT_DIR/cuda_tests.log" | tail -40
}
part_profile() {
    echo "== the GPU stage's parts (host time per image), and its kernels"
    timeout "${PROFILE_S:-60}" $PY benchmarks/profile_gpu_stage.py --images 10000 --seconds 8 \
        --trace 2>&1 | tee "$OUT_DIR/profile_gpu_stage.txt"
}
part_decoders() {
    echo "== decoders"
    timeout "${DECODE_S:-150}" $PY benchmarks/bench_gpu_decode.py --images 10000 --seconds 4
    cp benchmarks/results/bench_gpu_decode.md "$OUT_DIR"/ 2>/dev/null
}
part_train() {
    echo "== training"
    timeout "${TRAIN_S:-420}" $PY benchmarks/bench_gpu_train.py --windows --images 10000 \
        ${TRAIN_ONLY:+--only $TRAIN_ONLY}
    cp benchmarks/results/bench_gpu_windows.* "$OUT_DIR"/ 2>/dev/null
}
part_memory() {
    echo "== memory (issue 23: PSS of the tree over 2 epochs, 4 workers)"
    timeout "${MEMORY_S:-80}" $PY benchmarks/bench_loader_memory.py --runs "${MEMORY_RUNS:-1}" \
        --jobs images --kinds torch,asyncflow,folder 2>&1 | tee "$OUT_DIR/bench_loader_memory.txt"
}
part_kernel() {
    echo "== one-thread kernel against plain PIL (issue 23)"
    timeout "${KERNEL_S:-45}" $PY benchmarks/profile_kernel.py --images 150 --passes 1 \
        --rounds 3 --top 12 2>&1 | tee "$OUT_DIR/profile_kernel.txt"
}
case "$PHASE" in
    check) PARTS="tests profile decoders" ;;
    train) PARTS="train" ;;
    lean) PARTS="memory kernel" ;;
    session) PARTS="tests cuda-tests profile train memory kernel" ;;
    all) PARTS="tests cuda-tests profile decoders train memory kernel" ;;
    parts) PARTS=${PARTS:?PARTS names the parts to run} ;;
    *) echo "unknown phase: $PHASE" >&2; exit 2 ;;
esac
for p in $PARTS; do "part_${p//-/_}"; done
echo "== left behind"; ls /dev/shm | head; ps -eo pid,comm | grep -c python
