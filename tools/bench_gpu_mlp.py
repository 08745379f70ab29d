#!/usr/bin/env python3
"""PyTorch reference for Trainyard's GPU MLP benchmark.

Times one MLP block, fc1 [h -> ffn] + bias, GELU, fc2 [ffn -> h] + bias,
forward and backward (eager mode), at h=8192, ffn=4h, tokens=8192 by default,
in bf16 and in fp32 with TF32 matmuls (torch.backends.cuda.matmul.allow_tf32),
plus a bare torch.matmul of the fc1 shape ([T, h] @ [h, ffn]) as a ceiling.
Timing: CUDA events around `--iters` iterations after `--warmup` ones.

FLOPs are counted as in our kernel benchmark: forward + backward is 6 GEMMs
(fc1, fc2 forward; input and weight gradient of each backward) of
2 * T * h * ffn flops each; the GEMM ceiling is 1 GEMM. Bias, GELU and the
optimizer are not counted (they are timed, though).

Also times one full training step of the model of Trainyard's
worker/gpu_train_step_benchmark (2 blocks of pre-LayerNorm, fc1, GELU (tanh),
fc2, residual; fp32 master weights under bf16 autocast; MSE; clip_grad_norm_;
fused AdamW) and reports its model FLOPs utilisation against --peak_tflops
(989.4: H100 SXM dense bf16), the figure ours is compared with.

Output: one JSON line per measurement on stdout.

  python3 tools/bench_gpu_mlp.py                  # on a GPU machine
  python3 tools/bench_gpu_mlp.py --dry-run        # CPU, tiny sizes: checks
                                                  # shapes and the bookkeeping
"""

import argparse
import json
import sys
import time


def mlp_flops(tokens, hidden, ffn):
    """Forward + backward FLOPs of one block: 6 GEMMs of 2*T*h*ffn."""
    return 6 * 2 * tokens * hidden * ffn


def gemm_flops(tokens, hidden, ffn):
    return 2 * tokens * hidden * ffn


def build_block(torch, hidden, ffn, dtype, device):
    fc1 = torch.nn.Linear(hidden, ffn, device=device, dtype=dtype)
    fc2 = torch.nn.Linear(ffn, hidden, device=device, dtype=dtype)
    return fc1, fc2


def block_step(torch, fc1, fc2, x, dy):
    y = fc2(torch.nn.functional.gelu(fc1(x)))  # [T, h]
    y.backward(dy)
    return y


def check_shapes(torch, fc1, fc2, x, tokens, hidden, ffn):
    """The bookkeeping the FLOP count relies on."""
    assert tuple(fc1.weight.shape) == (ffn, hidden), fc1.weight.shape
    assert tuple(fc2.weight.shape) == (hidden, ffn), fc2.weight.shape
    assert tuple(x.shape) == (tokens, hidden), x.shape
    assert x.grad is not None and tuple(x.grad.shape) == (tokens, hidden)
    assert tuple(fc1.weight.grad.shape) == (ffn, hidden)
    assert tuple(fc2.weight.grad.shape) == (hidden, ffn)


def time_cuda(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters  # seconds per iteration


def time_cpu(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def run_case(torch, args, name, dtype, device):
    T, h, f = args.tokens, args.hidden, args.ffn
    fc1, fc2 = build_block(torch, h, f, dtype, device)
    x = torch.randn(T, h, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(T, h, device=device, dtype=dtype)

    def step():
        x.grad = None
        fc1.weight.grad = fc1.bias.grad = None
        fc2.weight.grad = fc2.bias.grad = None
        block_step(torch, fc1, fc2, x, dy)

    step()
    check_shapes(torch, fc1, fc2, x, T, h, f)
    a = torch.randn(T, h, device=device, dtype=dtype)
    b = torch.randn(h, f, device=device, dtype=dtype)

    def gemm():
        torch.matmul(a, b)

    timer = ((lambda fn: time_cuda(torch, fn, args.warmup, args.iters))
             if device == "cuda" else
             (lambda fn: time_cpu(fn, args.warmup, args.iters)))
    results = []
    for what, fn, flops in (("mlp_fwd_bwd", step, mlp_flops(T, h, f)),
                            ("gemm_fc1", gemm, gemm_flops(T, h, f))):
        sec = timer(fn)
        results.append({
            "bench": what, "mode": name, "tokens": T, "hidden": h, "ffn": f,
            "device": (torch.cuda.get_device_name(0) if device == "cuda"
                       else "cpu"),
            "torch": torch.__version__, "warmup": args.warmup,
            "iters": args.iters, "ms": round(sec * 1e3, 4), "flops": flops,
            "tflops": round(flops / sec / 1e12, 3), "dry_run": args.dry_run,
        })
    return results


def train_step_case(torch, args, device):
    """One training step of the 2-block model, as our GPU benchmark runs it."""
    h, ffn, t = args.hidden, args.ffn, args.tokens
    blocks = torch.nn.ModuleList()
    for _ in range(2):
        blocks.append(torch.nn.ModuleDict({
            "norm": torch.nn.LayerNorm(h, device=device),
            "fc1": torch.nn.Linear(h, ffn, device=device),
            "fc2": torch.nn.Linear(ffn, h, device=device),
        }))
    params = [p for b in blocks for p in b.parameters()]
    try:
        opt = torch.optim.AdamW(params, lr=1e-5, fused=device == "cuda")
    except TypeError:  # torch without fused AdamW
        opt = torch.optim.AdamW(params, lr=1e-5)
    x = torch.randn(t, h, device=device)
    target = torch.randn(t, h, device=device)
    gelu = torch.nn.functional.gelu

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            y = x
            for b in blocks:
                y = y + b["fc2"](gelu(b["fc1"](b["norm"](y)), approximate="tanh"))
            loss = torch.nn.functional.mse_loss(y.float(), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    if device == "cuda":
        seconds = time_cuda(torch, step, args.warmup, args.iters)
    else:
        seconds = time_cpu(step, args.warmup, args.iters)
    flops = 2 * mlp_flops(t, h, ffn)
    return {"bench": "train_step", "mode": "bf16", "blocks": 2, "hidden": h,
            "ffn": ffn, "tokens": t, "step_ms": seconds * 1e3,
            "samples_per_sec": t / seconds, "tflops": flops / seconds / 1e12,
            "mfu": flops / seconds / (args.peak_tflops * 1e12),
            "torch": torch.__version__}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--ffn", type=int, default=0, help="default 4 * hidden")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--modes", default="bf16,tf32")
    p.add_argument("--peak_tflops", type=float, default=989.4)
    p.add_argument("--no-train-step", action="store_true",
                   help="skip the full training-step measurement")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, tiny sizes (h=64, T=48 unless given), fp32: "
                   "checks shapes and FLOP bookkeeping only")
    args = p.parse_args(argv)
    import torch  # after argument parsing: --help works without torch

    if args.dry_run:
        if "--hidden" not in argv:
            args.hidden = 64
        if "--tokens" not in argv:
            args.tokens = 48
        args.warmup, args.iters = 1, 2
    if args.ffn == 0:
        args.ffn = 4 * args.hidden
    assert mlp_flops(2, 3, 12) == 6 * gemm_flops(2, 3, 12) == 864

    if args.dry_run:
        device = "cpu"
        modes = [("fp32_cpu_dry_run", torch.float32)]
    else:
        if not torch.cuda.is_available():
            print("bench_gpu_mlp: no CUDA device visible to torch "
                  f"{torch.__version__}; use --dry-run to check the script "
                  "on CPU", file=sys.stderr)
            return 2
        device = "cuda"
        known = {"bf16": torch.bfloat16, "tf32": torch.float32}
        modes = []
        for m in args.modes.split(","):
            if m not in known:
                print(f"bench_gpu_mlp: unknown mode {m!r}; use bf16, tf32",
                      file=sys.stderr)
                return 2
            modes.append((m, known[m]))
    for name, dtype in modes:
        if device == "cuda":
            tf32 = name == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        for r in run_case(torch, args, name, dtype, device):
            print(json.dumps(r), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    if not args.no_train_step:
        print(json.dumps(train_step_case(torch, args, device)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
