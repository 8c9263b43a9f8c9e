#!/usr/bin/env bash
# Runs the main job: the DDP training example when built, else the tensor example.
set -euo pipefail
build=${1:-build}
if [ -x "$build/examples/ddp_train" ]; then exec "$build/examples/ddp_train"; fi
if [ -x "$build/examples/train_mlp" ]; then exec "$build/examples/train_mlp"; fi
exec "$build/examples/tensor_tour"
