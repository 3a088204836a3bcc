#!/bin/bash
cd "$(dirname "$0")/../../.."
ROOT=$(.venv/bin/python -c "import sys; sys.path.insert(0,'benchmarks'); from _imagedata import build_dataset; print(build_dataset(1024))")
for rep in 1 2 3 4 5; do
  if [ $((rep % 2)) = 1 ]; then order="folder folder-kernel"; iorder="asyncflow asyncflow-kernel"; else order="folder-kernel folder"; iorder="asyncflow-kernel asyncflow"; fi
  for ms in 15 0; do
    for kind in $order; do
      echo "gil $kind ms=$ms $(.venv/bin/python -W ignore benchmarks/_gil_loaders.py $kind --root $ROOT --workers 2 --ms $ms --epochs 1)"
    done
  done
  for kind in $iorder; do
    echo "images $kind $(.venv/bin/python -W ignore benchmarks/_loaders.py $kind --root $ROOT --workers 2 --epochs 1)"
  done
done
