#!/usr/bin/python3
"""The CPU training step against PyTorch, side by side in one run.

Trainyard: engine/train_step_benchmark's BM_StepBreakdown (one stage, 4
blocks of h = 1024, ffn = 4096, exact GELU, bias, no norm; batch 256 in
M = 1, 4 or 8 microbatches; MSE, AdamW, clip 1.0), which times in each
iteration the whole step, its GEMMs alone (by kind), its element-wise passes
alone, its optimizer, and the SGEMM ceiling (one full-batch fc1 GEMM).
PyTorch: the same model, batch and update (nn.Linear/GELU, MSELoss, AdamW,
clip_grad_norm_ 1.0), one step per batch of 256 (PyTorch has no
microbatches: its figure is the M = 1 step every row compares with).

Rounds alternate (Trainyard's three M with each GEMM variant, then
PyTorch) on the same threads, so all see the same machine; the table gives
each round and the medians. "share of ceiling" is the step's GEMM flops
over its time, over the ceiling timed in the same benchmark iteration: a
round's share is the median over its iterations. The variants (--gemm):
"packed" runs the benchmark with TRAINYARD_PACKED_GEMM=1 (microbatches of
at most 256 rows on CPUs with AVX-512, else 128, on kernels/packed_gemm.h: the
weights packed by the first microbatch's forward GEMMs for the later GEMMs
and the input gradients, the weight gradients chained over the step's
microbatches), "openblas" with =0 (every GEMM on OpenBLAS),
"avx2" and "avx512" with the packed GEMM on that kernel, "default" as the
process would choose; "both" (the default) runs packed and openblas side
by side; a comma-separated list runs those (e.g. packed,avx512,openblas).

Build, then run from the repository root with Debian's Python (torch 1.13):
    bazel build //engine:train_step_benchmark
    env -u OPENBLAS_CORETYPE /usr/bin/python3 tools/bench_cpu_step.py \
        [--rounds 3] [--threads 2] [--min_time 2]

PyTorch runs with OPENBLAS_CORETYPE set to --torch_coretype (default Zen,
the fastest of its OpenBLAS kernels measured on the 2-vCPU EPYC; a PyTorch
built with MKL or oneDNN ignores it); Trainyard picks its own from CPUID.
The GPU bundle's run.sh runs this on the GPU machine's CPU (its PyTorch,
--bench and --ld_library_path pointing into the bundle).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bazel-bin", "engine", "train_step_benchmark")

TORCH_STEP = r"""
import json, sys, time, torch
steps, threads, h, ffn, blocks, batch = map(int, sys.argv[1:7])
torch.set_num_threads(threads)
torch.manual_seed(1)
layers = []
for _ in range(blocks):
    layers += [torch.nn.Linear(h, ffn), torch.nn.GELU(), torch.nn.Linear(ffn, h)]
model = torch.nn.Sequential(*layers)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(batch, h)
y = torch.randn(batch, h)
loss_fn = torch.nn.MSELoss()
def step():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
for _ in range(2):
    step()
start = time.perf_counter()
for _ in range(steps):
    step()
seconds = (time.perf_counter() - start) / steps
print(json.dumps({"step_ms": 1e3 * seconds, "samples_per_s": batch / seconds,
                  "torch": torch.__version__,
                  "blas": [w.split("=", 1)[1] for w in
                           torch.__config__.show().replace(",", " ").split()
                           if w.startswith("BLAS_INFO=")]}))
"""


def machine():
    """The CPU's model name and whether it has AVX-512 (/proc/cpuinfo)."""
    model, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    return f"{model}, {os.cpu_count()} CPUs, " + (
        "AVX-512" if "avx512f" in flags else
        "AVX2, no AVX-512" if "avx2" in flags else "no AVX2")


VARIANTS = {"packed": "1", "openblas": "0", "avx2": "avx2",
            "avx512": "avx512", "default": None}


def run_trainyard(args, variant):
    """BM_StepBreakdown for M = 1, 4, 8: {M: counters}."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "TRAINYARD_PACKED_GEMM")}
    if VARIANTS[variant] is not None:
        env["TRAINYARD_PACKED_GEMM"] = VARIANTS[variant]
    if args.ld_library_path:
        env["LD_LIBRARY_PATH"] = args.ld_library_path
    out = subprocess.run(
        [args.bench, "--benchmark_filter=BM_StepBreakdown",
         f"--benchmark_min_time={args.min_time}", "--benchmark_format=json"],
        check=True, capture_output=True, text=True, env=env)
    result = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        m = int(b["name"].split("/")[1][1:])
        result[m] = b
    return result


def run_torch(args):
    env = dict(os.environ, OPENBLAS_CORETYPE=args.torch_coretype,
               OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run(
        [sys.executable, "-c", TORCH_STEP, str(args.torch_steps),
         str(args.threads), "1024", "4096", "4", "256"],
        check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min_time", type=float, default=2.0)
    p.add_argument("--torch_steps", type=int, default=8)
    p.add_argument("--torch_coretype", default="Zen")
    p.add_argument("--gemm", default="both",
                   help="both, or a comma-separated list of: " +
                   ", ".join(sorted(VARIANTS)))
    p.add_argument("--bench", default=BENCH,
                   help="the train_step_benchmark binary")
    p.add_argument("--ld_library_path", default="",
                   help="LD_LIBRARY_PATH for the benchmark binary only (the "
                   "GPU bundle's lib/)")
    args = p.parse_args()
    print(f"machine: {machine()}", flush=True)
    if args.threads != 2:
        sys.exit("BM_StepBreakdown runs 2 threads; use --threads 2")
    variants = (["packed", "openblas"] if args.gemm == "both" else
                args.gemm.split(","))
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"--gemm: unknown variant {v!r} (one of "
                     f"{', '.join(sorted(VARIANTS))})")
    rows = []
    for r in range(args.rounds):
        ty = {}
        # Rotate the variants' order per round.
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            ty[v] = run_trainyard(args, v)
        pt = run_torch(args)
        rows.append((ty, pt))
        line = {"round": r + 1, "torch_samples_per_s": round(pt["samples_per_s"], 1)}
        for v in variants:
            for m, b in sorted(ty[v].items()):
                key = f"{v}_m{m}"
                line[f"{key}_samples_per_s"] = round(b["samples/s"], 1)
                line[f"{key}_of_ceiling"] = round(b["step_of_ceiling"], 3)
                line[f"{key}_x_torch"] = round(
                    b["samples/s"] / pt["samples_per_s"], 2)
        print(json.dumps(line), flush=True)

    print(f"\ntorch {rows[0][1]['torch']} (BLAS {rows[0][1]['blas']}), "
          f"{args.threads} threads, "
          f"{args.rounds} rounds, medians")
    print("| | step | samples/s | x PyTorch M = 1 | GEMMs alone, share of "
          "ceiling | step, share of ceiling | ceiling GFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    med = statistics.median
    torch_sps = med(pt["samples_per_s"] for _, pt in rows)
    print(f"| PyTorch, batch 256 | {med(pt['step_ms'] for _, pt in rows):.0f} ms "
          f"| {torch_sps:.0f} | 1.00 | | | |")
    for v in variants:
        for m in sorted(rows[0][0][v]):
            bs = [ty[v][m] for ty, _ in rows]
            ratios = [ty[v][m]["samples/s"] / pt["samples_per_s"]
                      for ty, pt in rows]
            print(f"| Trainyard {v}, M = {m} ({256 // m} rows) | "
                  f"{med(b['step_ms'] for b in bs):.0f} ms "
                  f"(GEMMs fwd {med(b['gemm_fwd_ms'] for b in bs):.0f}, "
                  f"dgrad {med(b['gemm_dgrad_ms'] for b in bs):.0f}, "
                  f"wgrad {med(b['gemm_wgrad_ms'] for b in bs):.0f}; "
                  f"element-wise {med(b['elementwise_ms'] for b in bs):.0f}; "
                  f"optimizer {med(b['optimizer_ms'] for b in bs):.0f}; "
                  f"other {med(b['other_ms'] for b in bs):.0f}) "
                  f"| {med(b['samples/s'] for b in bs):.0f} "
                  f"| {med(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
                  f"| {100 * med(b['gemms_of_ceiling'] for b in bs):.0f}% "
                  f"| {100 * med(b['step_of_ceiling'] for b in bs):.0f}% "
                  f"({100 * min(b['step_of_ceiling'] for b in bs):.0f}-"
                  f"{100 * max(b['step_of_ceiling'] for b in bs):.0f}%) "
                  f"| {med(b['ceiling_GFLOPs'] for b in bs):.0f} |")


if __name__ == "__main__":
    main()
