#!/usr/bin/env python3
"""Loads ddp_train's model.safetensors the way README.md says (safetensors.torch.load_file into
torch.nn.Sequential with strict names and shapes) and checks that the loaded model classifies
fresh spiral points, the task of examples/ddp_train.cpp.

    python3 torch_load_check.py <model.safetensors>

Needs torch and safetensors; exits 1 naming the problem."""
import math
import random
import sys

import torch
from safetensors.torch import load_file


def spiral_point(rng):
    """A point of one of three arms (1.5 turns, 120 degrees apart), as ddp_train draws them."""
    arm, r = rng.randrange(3), 0.1 + 0.9 * rng.random()
    angle = 2 * math.pi * (arm / 3.0 + 1.5 * r)
    return [r * math.cos(angle) + rng.gauss(0, 0.03), r * math.sin(angle) + rng.gauss(0, 0.03)], arm


def main():
    if len(sys.argv) != 2:
        print("usage: torch_load_check.py <model.safetensors>")
        return 1
    model = torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 3))
    model.load_state_dict(load_file(sys.argv[1]), strict=True)
    rng = random.Random(7)
    points = [spiral_point(rng) for _ in range(2000)]
    x = torch.tensor([p for p, _ in points])
    y = torch.tensor([arm for _, arm in points])
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    print(f"torch_load_check: torch {torch.__version__} loaded {sys.argv[1]} strictly; "
          f"accuracy {100 * accuracy:.1f}% on 2000 fresh points")
    return 0 if accuracy >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
