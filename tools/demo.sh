#!/usr/bin/env bash
# `make demo`: trains an MLP with DistributedDataParallel on 2 local ranks (examples/ddp_train.cpp)
# and writes its loss curve (CSV, SVG) and model (.safetensors) to <build>/demo/.
set -euo pipefail
build=${1:-build}
out="$build/demo"
"$build/examples/ddp_train" --world-size 2 --out "$out"
echo "view the loss curve: open $out/loss.svg in a browser (data in $out/loss.csv)"
echo "load the model in PyTorch: see \"Load the model in PyTorch\" in README.md"
