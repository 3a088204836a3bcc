#!/bin/bash
cd "$(dirname "$0")/../../.."
ROOT=$(.venv/bin/python -c "import sys; sys.path.insert(0,'benchmarks'); from _imagedata import build_dataset; print(build_dataset(1024))")
for rep in 1 2 3 4 5 6 7 8; do
  if [ $((rep % 2)) = 1 ]; then order="folder folder-kernel"; else order="folder-kernel folder"; fi
  for kind in $order; do
    echo "gil $kind ms=15 $(.venv/bin/python -W ignore benchmarks/_gil_loaders.py $kind --root $ROOT --workers 2 --ms 15 --epochs 2)"
  done
done
