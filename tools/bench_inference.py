#!/usr/bin/python3
"""Inference throughput: rows/s of a Trainyard inference job against PyTorch
running the same model under torch.inference_mode(), side by side in one
run, alternating, on the same threads.

The model (CPU) is the training benchmark's (engine/train_step_benchmark.cc):
4 blocks, h = 1024, ffn = 4096, exact GELU, bias, no norm, with random
weights written as model.init.safetensors; the task is mse (its output: the
model's output). The job reads N rows of float32 features from .npy, runs
batches of --batch rows, and writes the outputs as .npy shards; PyTorch runs
the same batches through nn.Linear/GELU and keeps the outputs in memory.

Rows/s for Trainyard is the job's own figure (its shard lines: rows over the
seconds from the first row to the last shard written, files included);
"end to end" adds the process start, loading the data and the model. The
outputs of both are compared (max abs difference), so the two compute the
same thing.

Build, then run from the repository root:
    bazel build //cli:trainyard //task_plugins:plugins
    env -u OPENBLAS_CORETYPE /usr/bin/python3 tools/bench_inference.py \
        [--rows 16384] [--batch 256] [--threads 2] [--rounds 3]

On a GPU (--device cuda; the GPU bundle's run.sh runs it): by default the
2-block h = 8192, ffn = 32768 model in bf16, 8192-row batches; PyTorch's
model is cast to bfloat16 on cuda:0 and, like the job, takes each batch from
host memory and returns its outputs to host memory as float32.
--ld_library_path is the trainyard binary's (the bundle's lib/).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_model(args, folder):
    """Random nn.Linear-initialised weights, in Trainyard's names, as
    safetensors; and the torch model holding the same."""
    torch.manual_seed(1)
    layers, tensors = [], {}
    for i in range(args.blocks):
        fc1 = torch.nn.Linear(args.hidden, args.ffn)
        fc2 = torch.nn.Linear(args.ffn, args.hidden)
        layers += [fc1, torch.nn.GELU(), fc2]
        for name, lin in (("fc1", fc1), ("fc2", fc2)):
            tensors[f"blocks.{i}.{name}.weight"] = lin.weight.detach().contiguous()
            tensors[f"blocks.{i}.{name}.bias"] = lin.bias.detach().contiguous()
    path = os.path.join(folder, "model.safetensors")
    write_safetensors(path, tensors)
    return path, torch.nn.Sequential(*layers).eval()


def write_safetensors(path, tensors):
    """The safetensors format by hand: Debian has no safetensors package."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = tensors[name].numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def spec(args, folder, model, output):
    return {
        "name": "bench-infer", "kind": "infer",
        "device": args.device, "precision": args.precision,
        "model": {"blocks": [{"outFeatures": args.hidden, "ffnHiddenSize": args.ffn,
                              "activation": "gelu"}] * args.blocks,
                  "init": {"safetensors": model}},
        "task": {"plugin": "mse"},
        # The rows are held in memory (an npy pair): the data limit is set to
        # hold them.
        "data": {"train": {"npy": {"features": os.path.join(folder, "x.npy"),
                                   "targets": os.path.join(folder, "y.npy")}},
                 "batchSize": args.batch,
                 "memoryLimitMib": 64 + sum(
                     os.path.getsize(os.path.join(folder, n)) for n in ("x.npy", "y.npy"))
                 // (1 << 20)},
        "inference": {"outputDir": output, "shardRows": args.rows},
    }


def run_trainyard(args, folder, model, round_):
    output = os.path.join(folder, f"out-{round_}")
    path = os.path.join(folder, f"spec-{round_}.json")
    with open(path, "w") as f:
        json.dump(spec(args, folder, model, output), f)
    lines = os.path.join(folder, f"lines-{round_}.jsonl")
    env = dict(os.environ)
    if args.ld_library_path:
        env["LD_LIBRARY_PATH"] = args.ld_library_path
    start = time.perf_counter()
    run = subprocess.run([args.trainyard, "infer", "--spec", path, "--metrics_out", lines,
                          f"--threads={args.threads}", f"--plugin_dir={args.plugin_dir}"],
                         capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise SystemExit(f"trainyard infer failed:\n{run.stderr[-3000:]}")
    end_to_end = time.perf_counter() - start
    (shard,) = [json.loads(line) for line in open(lines)]
    out = np.load(os.path.join(output, "shard-00000", "outputs.npy"))
    shutil.rmtree(output)
    return shard["rows_per_sec"], args.rows / end_to_end, out


def run_torch(args, net, x):
    torch.set_num_threads(args.threads)
    outs = []
    with torch.inference_mode():
        start = time.perf_counter()
        for b in range(0, args.rows, args.batch):
            if args.device == "cuda":
                batch = x[b:b + args.batch].to("cuda", non_blocking=True)
                outs.append(net(batch.to(torch.bfloat16 if args.precision == "bf16"
                                         else torch.float32)).float().cpu())
            else:
                outs.append(net(x[b:b + args.batch]))
        seconds = time.perf_counter() - start
    return args.rows / seconds, torch.cat(outs).numpy()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--batch", type=int, default=None, help="256 (cpu), 8192 (cuda)")
    p.add_argument("--blocks", type=int, default=None, help="4 (cpu), 2 (cuda)")
    p.add_argument("--hidden", type=int, default=None, help="1024 (cpu), 8192 (cuda)")
    p.add_argument("--precision", default=None, help="fp32 (cpu), bf16 (cuda)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trainyard", default=os.path.join(REPO, "bazel-bin/cli/trainyard"))
    p.add_argument("--plugin_dir", default=os.path.join(REPO, "bazel-bin/task_plugins"))
    p.add_argument("--ld_library_path", default="")
    args = p.parse_args()
    gpu = args.device == "cuda"
    args.batch = args.batch or (8192 if gpu else 256)
    args.blocks = args.blocks or (2 if gpu else 4)
    args.hidden = args.hidden or (8192 if gpu else 1024)
    args.ffn = 4 * args.hidden
    args.precision = args.precision or ("bf16" if gpu else "fp32")
    folder = tempfile.mkdtemp(prefix="bench-infer-")
    try:
        model, net = write_model(args, folder)
        if gpu:
            net = net.to("cuda", torch.bfloat16 if args.precision == "bf16"
                         else torch.float32)
        rng = np.random.default_rng(1)
        x = rng.standard_normal((args.rows, args.hidden), dtype=np.float32)
        np.save(os.path.join(folder, "x.npy"), x)
        np.save(os.path.join(folder, "y.npy"),
                np.zeros((args.rows, args.hidden), np.float32))
        xt = torch.from_numpy(x).pin_memory() if gpu else torch.from_numpy(x)
        ours, ours_e2e, theirs = [], [], []
        for r in range(args.rounds):
            rate, e2e, out = run_trainyard(args, folder, model, r)
            ours.append(rate)
            ours_e2e.append(e2e)
            rate_t, out_t = run_torch(args, net, xt)
            theirs.append(rate_t)
            diff = float(np.max(np.abs(out - out_t)))
            print(f"round {r + 1}: trainyard {rate:.0f} rows/s ({e2e:.0f} end to end), "
                  f"torch {rate_t:.0f} rows/s, max |diff| {diff:.2e}")
        m, t = statistics.median(ours), statistics.median(theirs)
        print(f"median: trainyard {m:.0f} rows/s ({statistics.median(ours_e2e):.0f} "
              f"end to end), torch.inference_mode {t:.0f} rows/s: ratio {m / t:.2f}")
        print(f"torch {torch.__version__}, {args.device}, {args.precision}, "
              f"{args.blocks} blocks h={args.hidden} ffn={args.ffn}, {args.threads} threads, "
              f"{args.rows} rows, batch {args.batch}")
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
