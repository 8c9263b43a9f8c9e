"""Checks that ddp_train's model.safetensors is what PyTorch's nn.Sequential loads directly.

    python3 check_model_safetensors.py <model.safetensors>

The file must hold exactly the state dict of
    nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))
("0.weight" [64, 2], "0.bias" [64], ..., little-endian F32, weights [out, in] as torch.nn.Linear),
with a valid safetensors header. The weights then run the forward pass as PyTorch would
(y = x @ W.T + b) on freshly drawn spiral points, which they must classify. Standard library
only; exits 1 naming the first problem.
"""
import json
import math
import random
import struct
import sys

EXPECTED = {"0.weight": [64, 2], "0.bias": [64], "2.weight": [64, 64], "2.bias": [64],
            "4.weight": [3, 64], "4.bias": [3]}


def fail(why):
    print("check_model_safetensors: " + why)
    sys.exit(1)


def read_tensors(path):
    blob = open(path, "rb").read()
    if len(blob) < 8:
        fail("file shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    if meta.get("format") != "pt":
        fail("metadata has no format 'pt' (safetensors.torch writes it): %r" % meta)
    if sorted(header) != sorted(EXPECTED):
        fail("tensor names %s, expected %s" % (sorted(header), sorted(EXPECTED)))
    spans = sorted((e["data_offsets"][0], e["data_offsets"][1], name) for name, e in header.items())
    end = 0
    for begin, stop, name in spans:
        if begin != end:
            fail("%s starts at %d, not right after the previous tensor (%d)" % (name, begin, end))
        end = stop
    if end != len(data):
        fail("tensors cover %d bytes of a %d-byte data section" % (end, len(data)))
    tensors = {}
    for name, e in header.items():
        if e["dtype"] != "F32" or e["shape"] != EXPECTED[name]:
            fail("%s is %s %s, expected F32 %s" % (name, e["dtype"], e["shape"], EXPECTED[name]))
        begin, stop = e["data_offsets"]
        if stop - begin != 4 * math.prod(e["shape"]):
            fail("%s spans %d bytes for shape %s" % (name, stop - begin, e["shape"]))
        tensors[name] = struct.unpack("<%df" % ((stop - begin) // 4), data[begin:stop])
    return tensors


def linear(t, layer, x):
    """torch.nn.Linear: weight [out, in] row-major, y = x @ weight.T + bias."""
    w, b = t[layer + ".weight"], t[layer + ".bias"]
    n_in = len(x)
    return [sum(w[o * n_in + i] * x[i] for i in range(n_in)) + b[o] for o in range(len(b))]


def predict(t, x):
    h = [math.tanh(v) for v in linear(t, "0", x)]
    h = [math.tanh(v) for v in linear(t, "2", h)]
    logits = linear(t, "4", h)
    return logits.index(max(logits))


def spiral_point(rng):
    """The task of ddp_train: which of three arms (1.5 turns, 120 degrees apart) a point is on."""
    arm, r = rng.randrange(3), 0.1 + 0.9 * rng.random()
    angle = 2 * math.pi * (arm / 3.0 + 1.5 * r)
    return [r * math.cos(angle) + rng.gauss(0, 0.03), r * math.sin(angle) + rng.gauss(0, 0.03)], arm


def main():
    if len(sys.argv) != 2:
        fail("usage: check_model_safetensors.py <model.safetensors>")
    tensors = read_tensors(sys.argv[1])
    rng = random.Random(2024)
    points = [spiral_point(rng) for _ in range(600)]
    accuracy = sum(predict(tensors, x) == arm for x, arm in points) / len(points)
    if accuracy < 0.9:
        fail("the loaded weights classify %.1f%% of fresh points (need 90%%)" % (100 * accuracy))
    print("check_model_safetensors: layout as nn.Sequential, accuracy %.1f%% on fresh points" % (100 * accuracy))


main()
