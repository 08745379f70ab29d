"""Compares every step's loss of two controller jobs and of a `trainyard
train` run of the same spec, bitwise (as IEEE doubles, not printed
decimals).

The jobs' steps come from the controller's WatchJob stream (replayed from
step 1) through the Python client in python/; the train run's from its
--metrics_out JSON lines (printed with 17 significant digits, so they parse
back to the same doubles). Prints one line per comparison, the recovery
events of the interrupted job, and writes every step's losses (hex floats) to
--out. Exit status 0 only when all three agree at every step and the
interrupted job did recover at least once.

Usage: compare_losses.py --controller HOST:PORT --reference JOB --interrupted JOB
         --train FILE.jsonl --out FILE.tsv   ($TRAINYARD_CA, $TRAINYARD_TOKEN_FILE)
"""
import argparse
import json
import sys

import trainyard


def job_losses(client, job_id):
    losses, recoveries, state = {}, [], None
    for ev in client.watch(job_id, from_step=1, timeout=120):
        if isinstance(ev, trainyard.StepEvent):
            if ev.step in losses:
                raise SystemExit(f"job {job_id}: step {ev.step} reported twice")
            losses[ev.step] = ev.loss
        elif isinstance(ev, trainyard.RecoveryEvent):
            recoveries.append(ev)
        elif isinstance(ev, trainyard.StateEvent) and ev.terminal:
            state = ev.state.name
    return losses, recoveries, state


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--controller", "--reference", "--interrupted", "--train", "--out"):
        ap.add_argument(flag, required=True)
    args = ap.parse_args()

    train = {}
    with open(args.train) as f:
        for line in f:
            m = json.loads(line)
            if "loss" in m and "step" in m:
                train[m["step"]] = float(m["loss"])

    ok = True
    with trainyard.Client(args.controller) as c:
        ref, ref_rec, ref_state = job_losses(c, args.reference)
        got, rec, state = job_losses(c, args.interrupted)
        steps = c.get(args.reference).spec.steps
    print(f"    job {args.reference} (uninterrupted): {ref_state}, {len(ref)} steps, "
          f"{len(ref_rec)} recoveries")
    print(f"    job {args.interrupted} (worker pod deleted): {state}, {len(got)} steps, "
          f"{len(rec)} recoveries")
    for r in rec:
        print(f"      recovery: {r}"[:300])
    print(f"    trainyard train (one process): {len(train)} steps")
    if not rec:
        print("FAIL: the interrupted job shows no recovery: the worker pod was not "
              "deleted while it ran")
        ok = False
    want = list(range(1, steps + 1))
    for name, losses in (("uninterrupted job", ref), ("interrupted job", got),
                         ("trainyard train", train)):
        if sorted(losses) != want:
            missing = sorted(set(want) - set(losses))[:5]
            print(f"FAIL: {name}: steps {len(losses)} of {steps}; missing e.g. {missing}")
            ok = False
    for name, other in (("interrupted job", got), ("trainyard train", train)):
        diff = [s for s in want if s in ref and s in other
                and ref[s].hex() != other[s].hex()]
        if diff:
            s = diff[0]
            print(f"FAIL: {name} differs from the uninterrupted job at {len(diff)} "
                  f"steps, first at step {s}: {other[s]!r} vs {ref[s]!r}")
            ok = False
        else:
            print(f"    {name}: all {steps} step losses bitwise equal to the "
                  f"uninterrupted job's (last: {ref.get(steps)!r})")
    with open(args.out, "w") as f:
        f.write("step\tuninterrupted\tinterrupted\ttrain\n")
        for s in want:
            row = [d[s].hex() if s in d else "-" for d in (ref, got, train)]
            f.write(f"{s}\t" + "\t".join(row) + "\n")
    if state != "SUCCEEDED" or ref_state != "SUCCEEDED":
        print(f"FAIL: states {ref_state} / {state}, want SUCCEEDED")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
