#!/usr/bin/env python3
"""PyTorch's figures for the GPU benchmarks, on the same device and with the same shapes as
bench/tensor_bench (CUDA section) and bench/gpu_bench: prints one JSON line per metric
(../shared/BENCH.md convention) with the torch_ prefix. Needs torch with CUDA; --quick for a
smoke run."""
import json
import os
import sys
import tempfile

import torch


def emit(metric, value, unit, **params):
    print(json.dumps({"bench": "gpu", "metric": metric, "value": value, "unit": unit, "params": params}), flush=True)


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def gemm(dtype, name, iters):
    n = 4096
    a = torch.rand(n, n, device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(dtype)
    b = torch.rand(n, n, device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(dtype)
    ms = time_ms(lambda: torch.matmul(a, b), 2, iters)
    emit(f"torch_cuda_{name}_4096_tflops", 2.0 * n ** 3 / (ms * 1e-3) / 1e12, "TFLOP/s", n=n, iters=iters)


def add(iters, quick):
    n = 1 << (24 if quick else 26)
    a, b = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
    ms = time_ms(lambda: torch.add(a, b), 3, iters)
    emit("torch_cuda_add_gbps", 3.0 * n * 4 / (ms * 1e-3) / 1e9, "GB/s", n=n, iters=iters)


def ddp_and_allreduce(iters, quick):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("nccl", init_method="file://" + os.path.join(d, "store"), rank=0, world_size=1)
        try:
            for mb in (1, 100):
                t = torch.ones(mb * (1 << 20) // 4, device="cuda")
                ms = time_ms(lambda: dist.all_reduce(t), 3, iters)
                emit(f"torch_cuda_nccl_allreduce_{mb}mb_1r_ms", ms, "ms", mb=mb, iters=iters)
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                        torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
            ddp = DistributedDataParallel(model, device_ids=[0])
            opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
            x = torch.randn(64, 1024, device="cuda")
            y = torch.randint(0, 10, (64,), device="cuda")

            def step():
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                torch.cuda.synchronize()

            import time
            for _ in range(2 if quick else 10):
                step()
            times = []
            for _ in range(5 if quick else 100):
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
            times.sort()
            emit("torch_cuda_ddp_step_ms", times[len(times) // 2], "ms", batch=64, sizes="1024-1024-1024-10",
                 iters=len(times))
        finally:
            dist.destroy_process_group()


def main():
    quick = "--quick" in sys.argv
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch: skipped")
        return 0
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    iters = 3 if quick else 20
    gemm(torch.float32, "sgemm", iters)
    gemm(torch.bfloat16, "bf16_gemm", iters)
    add(5 if quick else 50, quick)
    ddp_and_allreduce(3 if quick else 50, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
