#!/usr/bin/env python3
"""PyTorch's CPU figures for the shapes of bench/rpc_bench, bench/allreduce_bench and
bench/ddp_bench, on the same machine: one JSON line per metric (../shared/BENCH.md convention),
each named as Troupe's metric with the torch_ prefix.

- rpc (TensorPipe, 2 processes on loopback): torch_rpc_sync_small_rtt_median_us and _p99_us (a
  call of a function returning its int argument), torch_rpc_async_throughput_calls_per_s
  (windows of 2000 calls), torch_tensor_echo_64mb_gbps / _rtt_ms (a 64 MB float32 tensor sent
  and returned).
- gloo, 2 processes: torch_allreduce_busbw_100mb_2r_gbps, torch_allreduce_1mb_2r_ms.
- DDP over gloo, 2 processes, MLP 1024-1024-1024-10, batch 64 per rank, cores / 2 threads per
  rank as ddp_bench: torch_ddp_step_ms.

Needs torch; --quick for a smoke run (the figures mean nothing)."""
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def emit(bench, metric, value, unit, **params):
    print(json.dumps({"bench": bench, "metric": metric, "value": value, "unit": unit, "params": params}), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats(times):
    times = sorted(times)
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]


def noop(x):
    return x


def echo(t):
    return t


def rpc_worker(rank, port, quick, q):
    from torch.distributed import rpc

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=120)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        iters = 500 if quick else 20000
        for _ in range(iters // 10):
            rpc.rpc_sync("worker1", noop, args=(1,))
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            rpc.rpc_sync("worker1", noop, args=(1,))
            times.append((time.perf_counter() - t0) * 1e6)
        med, p99 = stats(times)
        q.put(("rpc", "torch_rpc_sync_small_rtt_median_us", med, "us", {"iters": iters}))
        q.put(("rpc", "torch_rpc_sync_small_rtt_p99_us", p99, "us", {"iters": iters}))
        calls, window = (4000 if quick else 100000), 2000
        t0 = time.perf_counter()
        for done in range(0, calls, window):
            futs = [rpc.rpc_async("worker1", noop, args=(i,)) for i in range(window)]
            torch.futures.wait_all(futs)
        q.put(("rpc", "torch_rpc_async_throughput_calls_per_s", calls / (time.perf_counter() - t0), "calls/s",
               {"calls": calls, "window": window}))
        t = torch.full((16 << 20,), 7.0)
        iters = 3 if quick else 30
        for _ in range(2):
            back = rpc.rpc_sync("worker1", echo, args=(t,))
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            back = rpc.rpc_sync("worker1", echo, args=(t,))
            times.append(time.perf_counter() - t0)
        assert torch.equal(back, t)
        med, _ = stats(times)
        q.put(("rpc", "torch_tensor_echo_64mb_gbps", t.numel() * 4 / med / 1e9, "GB/s", {"bytes": t.numel() * 4, "iters": iters}))
        q.put(("rpc", "torch_tensor_echo_64mb_rtt_ms", med * 1e3, "ms", {"bytes": t.numel() * 4, "iters": iters}))
    rpc.shutdown()


def gloo_worker(rank, port, quick, q):
    threads = max(1, (os.cpu_count() or 2) // 2)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for mb in (1, 100):
        t = torch.ones(mb * (1 << 20) // 4)
        iters = 3 if quick else (200 if mb == 1 else 20)
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        med, _ = stats(times)
        if rank == 0 and mb == 1:
            q.put(("allreduce", "torch_allreduce_1mb_2r_ms", med * 1e3, "ms", {"iters": iters}))
        if rank == 0 and mb == 100:
            q.put(("allreduce", "torch_allreduce_busbw_100mb_2r_gbps", 2 * (2 - 1) / 2 * t.numel() * 4 / med / 1e9, "GB/s",
                   {"iters": iters}))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))
    steps = 5 if quick else 100
    times = []
    for i in range(steps + (2 if quick else 10)):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    med, _ = stats(times[-steps:])
    if rank == 0:
        q.put(("ddp", "torch_ddp_step_ms", med * 1e3, "ms",
               {"batch": 64, "sizes": "1024-1024-1024-10", "iters": steps, "threads_per_rank": threads}))
    dist.destroy_process_group()


def run(target, quick):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, quick, q)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        if p.exitcode != 0:
            print(f"# {target.__name__} rank exited with {p.exitcode}", flush=True)
    while not q.empty():
        bench, metric, value, unit, params = q.get()
        emit(bench, metric, value, unit, **params)


def main():
    quick = "--quick" in sys.argv
    print(f"# torch {torch.__version__}, {os.cpu_count()} cpus", flush=True)
    run(rpc_worker, quick)
    run(gloo_worker, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
