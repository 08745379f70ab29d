"""Golden check: `trainyard train` follows PyTorch.

Builds the same MLP in PyTorch from the same initial weights (a safetensors
file both load), feeds it the same batches, and trains it with torch.optim
(AdamW / SGD), torch.nn.utils.clip_grad_norm_ and the spec's LR schedule,
then compares every step's loss and the final weights with what
`trainyard train` printed and checkpointed. The trainyard job runs split
across pipeline stages with uneven microbatches, so this also checks that
the pipeline computes the full-batch loss and gradient.

Run by Bazel with Debian's /usr/bin/python3 (python3-torch, numpy).
Usage: torch_reference_test.py TRAINYARD_BINARY
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import torch

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        blobs.append(arr.tobytes())
        offset += arr.nbytes
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        if info["dtype"] != "F32":
            continue
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b],
                                  dtype=np.float32).reshape(info["shape"])
    return out


class Block(torch.nn.Module):
    def __init__(self, d_in, d_out, ffn, act, norm, residual):
        super().__init__()
        self.act, self.norm_kind, self.residual = act, norm, residual
        if norm == "layernorm":
            self.norm = torch.nn.LayerNorm(d_in, eps=1e-5)
        elif norm == "rmsnorm":
            self.norm = torch.nn.Module()
            self.norm.weight = torch.nn.Parameter(torch.ones(d_in))
        self.fc1 = torch.nn.Linear(d_in, 2 * ffn if act == "swiglu" else ffn)
        self.fc2 = torch.nn.Linear(ffn, d_out)

    def forward(self, x):
        h = x
        if self.norm_kind == "layernorm":
            h = self.norm(h)
        elif self.norm_kind == "rmsnorm":
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * self.norm.weight
        h = self.fc1(h)
        if self.act == "relu":
            h = torch.relu(h)
        elif self.act == "gelu":
            h = torch.nn.functional.gelu(h)
        elif self.act == "gelu_tanh":
            h = torch.nn.functional.gelu(h, approximate="tanh")
        else:
            a, b = h.chunk(2, dim=-1)
            h = torch.nn.functional.silu(a) * b
        y = self.fc2(h)
        return y + x if self.residual else y


def lr_at(opt, step):
    sched = opt.get("schedule", {})
    lr, warm = opt["lr"], sched.get("warmupSteps", 0)
    total, min_lr = sched.get("totalSteps", 0) or STEPS, sched.get("minLr", 0.0)
    if step < warm:
        return lr * (step + 1) / warm
    kind = sched.get("type", "constant")
    if kind == "constant":
        return lr
    p = min(1.0, max(0.0, (step - warm) / max(1, total - warm)))
    if kind == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * p))
    return lr + (min_lr - lr) * p


STEPS = 15


def run_case(trainyard, workdir, name, blocks, opt, task, targets, stages,
             microbatches, schedule):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    n, d = 90, 10
    x = rng.standard_normal((n, d)).astype(np.float32)
    np.save(os.path.join(workdir, f"{name}_x.npy"), x)
    np.save(os.path.join(workdir, f"{name}_y.npy"), targets(rng, x))
    y = np.load(os.path.join(workdir, f"{name}_y.npy"))

    torch.manual_seed(0)
    model, d_in = torch.nn.Sequential(), d
    for i, b in enumerate(blocks):
        model.add_module(str(i), Block(d_in, b["outFeatures"], b["ffnHiddenSize"],
                                       b["activation"], b["norm"], b["residual"]))
        d_in = b["outFeatures"]
    init = {}
    for i, blk in enumerate(model):
        for pname, p in blk.named_parameters():
            with torch.no_grad():
                p.copy_(torch.randn_like(p) * 0.3)
            init[f"blocks.{i}.{pname}"] = p.detach().numpy().copy()
    write_safetensors(os.path.join(workdir, f"{name}_init.safetensors"), init)

    ckpt = os.path.join(workdir, f"{name}_ckpt")
    spec = {
        "name": name, "steps": STEPS, "seed": 5,
        "model": {"blocks": blocks, "init": {"safetensors": f"{name}_init.safetensors"}},
        "parallelism": {"stages": stages, "microbatches": microbatches,
                        "schedule": schedule},
        "optimizer": opt, "task": task,
        "data": {"train": {"npy": {"features": f"{name}_x.npy",
                                   "targets": f"{name}_y.npy"}},
                 "batchSize": 32, "shuffle": False},
        "checkpoint": {"dir": ckpt, "every": STEPS},
    }
    spec_path = os.path.join(workdir, f"{name}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    metrics = os.path.join(workdir, f"{name}.jsonl")
    subprocess.run([trainyard, "train", "--spec", spec_path, "--metrics_out",
                    metrics, "--threads", "1"], check=True)
    ours = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]

    no_decay = [p for n_, p in model.named_parameters()
                if n_.endswith("bias") or ".norm." in n_]
    decay = [p for n_, p in model.named_parameters()
             if not (n_.endswith("bias") or ".norm." in n_)]
    if opt["type"] == "adamw":
        optim = torch.optim.AdamW(
            [{"params": decay, "weight_decay": opt.get("weightDecay", 0.01)},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=opt["lr"], betas=(0.9, 0.999), eps=1e-8)
    else:
        optim = torch.optim.SGD(
            [{"params": decay, "weight_decay": opt.get("weightDecay", 0.0)},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=opt["lr"], momentum=opt.get("momentum", 0.0),
            nesterov=opt.get("nesterov", False))
    loss_fn = task_loss(task)
    theirs = []
    for step in range(STEPS):
        rows = [(step * 32 + i) % n for i in range(32)]
        xb = torch.from_numpy(x[rows])
        yb = torch.from_numpy(y[rows])
        for g in optim.param_groups:
            g["lr"] = lr_at(opt, step)
        optim.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        if opt.get("clipGrad", 0) > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt["clipGrad"])
        optim.step()
        theirs.append(loss.item())

    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    final = {}
    for k in range(stages):
        final.update(read_safetensors(os.path.join(
            ckpt, f"step_{STEPS:08d}", f"stage_{k}.safetensors")))
    worst_w = 0.0
    for i, blk in enumerate(model):
        for pname, p in blk.named_parameters():
            ref = p.detach().numpy()
            got = final[f"blocks.{i}.{pname}"]
            worst_w = max(worst_w, float(np.max(np.abs(got - ref)) /
                                         (np.max(np.abs(ref)) + 1e-12)))
    print(f"{name}: {len(ours)} steps; loss {theirs[0]:.5f} -> {theirs[-1]:.5f}; "
          f"max relative loss difference {worst_loss:.2e}; "
          f"max relative weight difference {worst_w:.2e}")
    assert len(ours) == STEPS, ours
    assert theirs[-1] < theirs[0], "reference did not learn; test is too weak"
    assert worst_loss < 1e-4, (ours, theirs)
    assert worst_w < 1e-4, worst_w


def task_loss(task):
    if task["plugin"] == "mse":
        return torch.nn.MSELoss()
    cfg = task.get("config", {})
    return torch.nn.CrossEntropyLoss(
        ignore_index=cfg.get("ignore_index", -100),
        label_smoothing=cfg.get("label_smoothing", 0.0))


def main():
    trainyard = os.path.abspath(sys.argv[1])
    workdir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    blocks = [
        {"outFeatures": 16, "ffnHiddenSize": 24, "activation": "gelu",
         "norm": "layernorm", "residual": False},
        {"outFeatures": 16, "ffnHiddenSize": 12, "activation": "swiglu",
         "norm": "rmsnorm", "residual": True},
        {"outFeatures": 16, "ffnHiddenSize": 20, "activation": "gelu_tanh",
         "norm": "none", "residual": True},
        {"outFeatures": 5, "ffnHiddenSize": 8, "activation": "relu",
         "norm": "layernorm", "residual": False},
    ]
    run_case(trainyard, workdir, "adamw_xent", blocks,
             {"type": "adamw", "lr": 0.01, "weightDecay": 0.1, "clipGrad": 0.5,
              "schedule": {"type": "cosine", "warmupSteps": 3, "minLr": 0.001}},
             {"plugin": "cross_entropy", "config": {"label_smoothing": 0.1}},
             # Learnable labels: the argmax of a fixed projection.
             lambda rng, x: np.argmax(x[:, :5] + 0.5 * x[:, 5:], axis=1).astype(np.int64),
             stages=2, microbatches=3, schedule="gpipe")
    run_case(trainyard, workdir, "sgd_mse", blocks,
             {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True,
              "weightDecay": 0.01, "clipGrad": 1.0,
              "schedule": {"type": "linear", "warmupSteps": 2, "minLr": 0.005}},
             {"plugin": "mse"},
             lambda rng, x: (0.5 * x[:, :5] * x[:, 5:]
                             + 0.1 * rng.standard_normal((x.shape[0], 5))).astype(np.float32),
             stages=4, microbatches=5, schedule="1f1b")
    print("PASS")


if __name__ == "__main__":
    main()
