#!/usr/bin/env python3
"""Helpers for the GPU bundle's run script (tools/gpu_bundle_run.sh).

Python 3 standard library only: the GPU machine may have nothing else.

  gpu_compare.py compare REF.jsonl GOT.jsonl --rtol R [--first-steps N]
                 [--min-final-accuracy A] [--same-final-accuracy]
      Every step's loss in GOT must be within R relative of REF's loss for
      the same step (with --first-steps, only steps 1..N: training is
      chaotic, and two correct runs that differ by rounding drift apart
      later; every later loss must still be finite), and GOT must have
      exactly REF's steps. With --min-final-accuracy, GOT's last
      eval_accuracy must be >= A; with --same-final-accuracy, equal to
      REF's. Prints one line starting PASS or FAIL; exit 0 (pass), 1
      (fail), 2 (unreadable input).
  gpu_compare.py spec IN.json OUT.json [--blocks N] [--stages S]
                 [--device D] [--precision P]
      Writes a variant of a job spec: at least N blocks (extra blocks are
      copies of a residual block, so layer widths do not change), S pipeline
      stages (an explicit split is dropped), the given device and precision.
      Relative data and init paths become absolute (relative to IN's folder),
      so OUT may live anywhere.
  gpu_compare.py summary RUN.jsonl
      One line: steps run, last loss, last eval_accuracy.
  gpu_compare.py bench TORCH.jsonl OURS.jsonl...
      Prints our benchmarks and the PyTorch reference side by side: TFLOP/s
      per benchmark and mode, and for full training steps the step time and
      MFU of each and the speed ratio (PyTorch's step time over ours).

Metric lines are the engine's: {"step":N,"loss":L,...} per step and
{"step":N,"eval_loss":...,"eval_accuracy":A,...} per eval. The engine
prints non-finite numbers as nan/inf, which are read as NaN/Infinity.
"""

import argparse
import copy
import json
import math
import os
import re
import sys

_NON_FINITE = re.compile(r"(?<=[:\[,])(\s*)(-?)(nan|inf)\b", re.IGNORECASE)


def _parse_line(line):
    try:
        return json.loads(line)
    except ValueError:
        fixed = _NON_FINITE.sub(
            lambda m: m.group(1) + ("NaN" if m.group(3).lower() == "nan"
                                    else m.group(2) + "Infinity"), line)
        return json.loads(fixed)


def read_metrics(path):
    """Returns ({step: loss}, [eval records in file order])."""
    losses, evals = {}, []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rec = _parse_line(line)
            except ValueError as e:
                raise ValueError("%s:%d: not JSON (%s): %s" %
                                 (path, n, e, line[:80]))
            if "eval_loss" in rec or "eval_accuracy" in rec:
                evals.append(rec)
            elif "loss" in rec and "step" in rec:
                losses[int(rec["step"])] = float(rec["loss"])
    return losses, evals


def compare(ref_path, got_path, rtol, min_accuracy=None, first_steps=None,
            same_accuracy=False):
    """Returns (ok, one-line message)."""
    ref, ref_evals = read_metrics(ref_path)
    got, got_evals = read_metrics(got_path)
    name = os.path.basename(got_path)
    if not ref:
        return False, "FAIL: %s has no step losses" % ref_path
    if not got:
        return False, "FAIL: %s has no step losses" % got_path
    missing = sorted(set(ref) - set(got))
    if missing:
        return False, ("FAIL: %s ran %d of the reference's %d steps; first "
                       "missing step %d" % (name, len(set(ref) & set(got)),
                                            len(ref), missing[0]))
    extra = sorted(set(got) - set(ref))
    if extra:
        return False, ("FAIL: %s has steps the reference lacks (first %d)" %
                       (name, extra[0]))
    worst_step, worst = None, -1.0
    held = 0
    for step in sorted(ref):
        r, g = ref[step], got[step]
        if not math.isfinite(g):
            return False, "FAIL: %s step %d loss is %r" % (name, step, g)
        if first_steps is not None and step > first_steps:
            continue
        held += 1
        rel = abs(g - r) / max(abs(r), 1e-30)
        if rel > worst:
            worst_step, worst = step, rel
        if rel > rtol:
            return False, ("FAIL: %s step %d loss %.9g vs reference %.9g: "
                           "relative difference %.3g > %g" %
                           (name, step, g, r, rel, rtol))
    if first_steps is None:
        msg = ("%d steps, max relative loss difference %.3g at step %d "
               "(tolerance %g)" % (len(ref), worst, worst_step, rtol))
    else:
        msg = ("%d steps; the first %d within %g (max relative loss "
               "difference %.3g at step %d)" % (len(ref), held, rtol, worst,
                                                 worst_step))
    accs = [e["eval_accuracy"] for e in got_evals if "eval_accuracy" in e]
    ref_accs = [e["eval_accuracy"] for e in ref_evals if "eval_accuracy" in e]
    if min_accuracy is not None or same_accuracy:
        if not accs:
            return False, "FAIL: %s has no eval_accuracy; %s" % (name, msg)
    if min_accuracy is not None and not accs[-1] >= min_accuracy:
        return False, ("FAIL: %s last eval_accuracy %.4f < %g; %s" %
                       (name, accs[-1], min_accuracy, msg))
    if same_accuracy:
        if not ref_accs:
            return False, "FAIL: %s has no eval_accuracy; %s" % (ref_path, msg)
        if accs[-1] != ref_accs[-1]:
            return False, ("FAIL: %s last eval_accuracy %.4f, the reference's "
                           "%.4f; %s" % (name, accs[-1], ref_accs[-1], msg))
    if accs:
        msg += "; last eval_accuracy %.4f" % accs[-1]
        if same_accuracy:
            msg += " (the reference's)"
    return True, "PASS: " + msg


def summary(path):
    losses, evals = read_metrics(path)
    if not losses:
        return "%s has no step losses" % path
    last = max(losses)
    msg = "%d steps, last loss %.6g" % (len(losses), losses[last])
    accs = [e["eval_accuracy"] for e in evals if "eval_accuracy" in e]
    if accs:
        msg += ", last eval_accuracy %.4f" % accs[-1]
    return msg


def _get(d, *names):
    for n in names:
        if n in d:
            return d[n]
    return None


def rewrite_spec(spec, base_dir, blocks=None, stages=None, device=None,
                 precision=None):
    """Returns a rewritten copy of a job spec (see the module comment)."""
    spec = copy.deepcopy(spec)
    model = spec.setdefault("model", {})
    layers = model.setdefault("blocks", [])
    if blocks is not None and len(layers) < blocks:
        if not layers:
            raise ValueError("model.blocks is empty: nothing to copy")
        residual = [i for i, b in enumerate(layers) if b.get("residual")]
        if residual:
            i = residual[-1]
            extra = layers[i]
        else:
            # A new residual block after block 0 keeps block 0's width.
            i = 0
            width = _get(layers[0], "outFeatures", "out_features")
            ffn = _get(layers[0], "ffnHiddenSize", "ffn_hidden_size")
            extra = {"outFeatures": width, "ffnHiddenSize": ffn or 4 * width,
                     "activation": "gelu", "residual": True}
        while len(layers) < blocks:
            layers.insert(i + 1, copy.deepcopy(extra))
    par = spec.setdefault("parallelism", {})
    if stages is not None:
        par["stages"] = stages
    if stages is not None or blocks is not None:
        par.pop("split", None)
    if device is not None:
        spec["device"] = device
    if precision is not None:
        spec["precision"] = precision

    def absolute(p):
        return p if not p or os.path.isabs(p) else os.path.normpath(
            os.path.join(base_dir, p))

    for part in ("train", "eval"):
        npy = (spec.get("data") or {}).get(part, {}).get("npy")
        for key in list(npy or {}):
            if isinstance(npy[key], str):
                npy[key] = absolute(npy[key])
    init = model.get("init") or {}
    if isinstance(init.get("safetensors"), str):
        init["safetensors"] = absolute(init["safetensors"])
    return spec


def _mode(rec):
    m = str(_get(rec, "mode", "compute", "precision") or "?")
    return {"bfloat16": "bf16", "float32": "fp32"}.get(m, m)


def _records(path):
    if not path or not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def bench_table(torch_path, ours_paths):
    rows = {}
    steps = {}  # (bench, mode) -> [ours record, torch record]
    for col, paths in ((1, [torch_path]), (0, ours_paths)):
        for path in paths:
            for rec in _records(path):
                bench = str(rec.get("bench", "?"))
                kind = "gemm" if bench.startswith("gemm") else bench
                rows.setdefault((kind, _mode(rec)), [None, None])[col] = (
                    rec.get("tflops"))
                if bench.startswith("train_step"):
                    steps.setdefault((bench, _mode(rec)),
                                     [None, None])[col] = rec
    out = ["%-26s %-5s %14s %14s %7s" % ("bench", "mode", "ours TFLOP/s",
                                          "torch TFLOP/s", "ratio")]
    for (kind, mode), (a, b) in sorted(rows.items()):
        ratio = "%.2f" % (a / b) if a and b else "-"
        out.append("%-26s %-5s %14s %14s %7s" % (
            kind, mode, "-" if a is None else a, "-" if b is None else b,
            ratio))
    if steps:
        out.append("")
        out.append("full training steps (step time, MFU; speed = torch time "
                   "/ ours):")
        out.append("%-26s %-5s %12s %8s %12s %8s %6s" % (
            "bench", "mode", "ours ms", "MFU", "torch ms", "MFU", "speed"))

        def cell(rec, key, fmt):
            v = rec.get(key) if rec else None
            return "-" if v is None else fmt % v

        for (bench, mode), (ours, theirs) in sorted(steps.items()):
            a = ours.get("step_ms") if ours else None
            b = theirs.get("step_ms") if theirs else None
            out.append("%-26s %-5s %12s %8s %12s %8s %6s" % (
                bench, mode, cell(ours, "step_ms", "%.2f"),
                cell(ours, "mfu", "%.3f"), cell(theirs, "step_ms", "%.2f"),
                cell(theirs, "mfu", "%.3f"),
                "%.2f" % (b / a) if a and b else "-"))
    return "\n".join(out)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("ref")
    c.add_argument("got")
    c.add_argument("--rtol", type=float, required=True)
    c.add_argument("--first-steps", type=int)
    c.add_argument("--min-final-accuracy", type=float)
    c.add_argument("--same-final-accuracy", action="store_true")
    s = sub.add_parser("spec")
    s.add_argument("input")
    s.add_argument("output")
    s.add_argument("--blocks", type=int)
    s.add_argument("--stages", type=int)
    s.add_argument("--device")
    s.add_argument("--precision")
    m = sub.add_parser("summary")
    m.add_argument("run")
    b = sub.add_parser("bench")
    b.add_argument("torch")
    b.add_argument("ours", nargs="+")
    args = p.parse_args(argv)

    if args.cmd == "compare":
        try:
            ok, msg = compare(args.ref, args.got, args.rtol,
                              args.min_final_accuracy, args.first_steps,
                              args.same_final_accuracy)
        except (OSError, ValueError) as e:
            print("FAIL: %s" % e)
            return 2
        print(msg)
        return 0 if ok else 1
    if args.cmd == "spec":
        try:
            with open(args.input) as f:
                spec = json.load(f)
            out = rewrite_spec(spec, os.path.dirname(os.path.abspath(
                args.input)), args.blocks, args.stages, args.device,
                args.precision)
        except (OSError, ValueError) as e:
            print("gpu_compare spec: %s: %s" % (args.input, e),
                  file=sys.stderr)
            return 2
        with open(args.output, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print("%s: %d blocks, %s stages%s" % (
            args.output, len(out["model"]["blocks"]),
            out.get("parallelism", {}).get("stages", 1),
            ", device %s" % out["device"] if "device" in out else ""))
        return 0
    if args.cmd == "summary":
        try:
            print(summary(args.run))
        except (OSError, ValueError) as e:
            print(e)
            return 2
        return 0
    print(bench_table(args.torch, args.ours))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
