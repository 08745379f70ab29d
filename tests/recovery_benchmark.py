"""Recovery benchmark: real controller and worker processes on 127.0.0.1.

  bazel run //tests:recovery_benchmark -- [--trials 3] [--rounds 3]
      [--batch 128] [--skip_recovery]

Part 1, recovery time: a 4-stage job on 4 workers plus a spare; after step
100 one worker of the gang is SIGKILLed; the job's JobRecovery event gives
the breakdown: detection (kill -> the controller noticed), rescheduling
(-> the new gang's assignments), restore (-> every stage restored its
state), warm-up (-> the first step completed after the resume). Lost work is
the steps redone (noticed-after step - resumed-after step) times the step
time measured before the kill. For checkpoints only (every 20 steps) and
for in-memory snapshots every 5 steps and every step.

Part 2, step-time overhead: the same job on 4 workers without checkpoints,
with asynchronous checkpoints every 20 steps, and with snapshots every 5 and
every step; steady-state step time over steps 100-400, configurations
interleaved round by round, medians compared with no checkpointing.
"""
import argparse
import os
import random
import re
import signal
import statistics
import sys
import threading
import time

import grpc

from cluster import (TERMINAL, Cluster, pb, pb_grpc, spec_from_json, wait_for,
                     wide_spec)


BATCH = 128


def spec(ckpt_dir, steps, every=0, snapshot_every=0):
    return wide_spec(
        "recovery-benchmark", steps, batch=BATCH,
        checkpoint={"dir": ckpt_dir, "every": every} if every else None,
        recovery={"maxRestarts": 3, "backoffMs": 0,
                  "snapshotEvery": snapshot_every})


class Recorder(threading.Thread):
    """Arrival time of every step event, and the recovery events."""

    def __init__(self, address, job_id):
        super().__init__(daemon=True)
        self.address, self.job_id = address, job_id
        self.arrival, self.recoveries = {}, []
        self.done = threading.Event()

    def run(self):
        stub = pb_grpc.JobServiceStub(grpc.insecure_channel(self.address))
        try:
            for e in stub.WatchJob(pb.WatchJobRequest(job_id=self.job_id),
                                   timeout=900):
                kind = e.WhichOneof("event")
                if kind == "step":
                    self.arrival[e.step.step] = time.time()
                elif kind == "recovery":
                    self.recoveries.append(e.recovery)
                elif kind == "state" and e.state.state in TERMINAL:
                    break
        except grpc.RpcError:
            pass
        self.done.set()

    def step_time(self, first, last):
        return (self.arrival[last] - self.arrival[first]) / (last - first)


def snapshot_bytes(cluster):
    sizes = set()
    for name in os.listdir(cluster.dir):
        if name.endswith(".log"):
            sizes.update(int(m) for m in re.findall(
                r"in-memory snapshots of job \S+ stage \d+ \((\d+) bytes",
                open(os.path.join(cluster.dir, name)).read()))
    return sorted(sizes)


def recovery_trial(every, snapshot_every, rng):
    cluster = Cluster(workers=5)
    try:
        job = cluster.submit(spec_from_json(spec(
            os.path.join(cluster.dir, "ckpt"), 100000, every, snapshot_every)))
        rec = Recorder(cluster.address, job.job_id)
        rec.start()
        wait_for(lambda: 100 in rec.arrival, 120, "step 100")
        step_s = rec.step_time(60, 100)
        # Kill at a random point of the checkpoint interval.
        target = 100 + rng.randrange(20)
        wait_for(lambda: target in rec.arrival, 60, f"step {target}")
        names = {w.worker_id: w.name for w in cluster.jobs.ListWorkers(
            pb.ListWorkersRequest(), timeout=10).workers}
        gang = [names[w] for w in cluster.get(job.job_id).workers]
        victim = rng.choice(gang)
        t_kill = time.time()
        cluster.kill_worker(victim, signal.SIGKILL)
        wait_for(lambda: rec.recoveries, 60, "the recovery event")
        r = rec.recoveries[0]
        sizes = snapshot_bytes(cluster)  # distinct sizes seen in the logs
        cluster.jobs.CancelJob(pb.CancelJobRequest(job_id=job.job_id), timeout=10)
        rec.done.wait(30)
        detect = r.detected_ms / 1000.0 - t_kill
        total = detect + r.reschedule_s + r.restore_s + r.warmup_s
        redone = r.detected_step - r.resume_step
        return {"detect": detect, "reschedule": r.reschedule_s,
                "restore": r.restore_s, "warmup": r.warmup_s, "total": total,
                "redone_steps": redone, "lost_s": redone * step_s,
                "step_ms": step_s * 1000, "from_snapshot": r.from_snapshot,
                "snapshot_bytes": sizes}
    finally:
        cluster.stop()


def overhead_run(cluster, every, snapshot_every):
    job = cluster.submit(spec_from_json(spec(
        os.path.join(cluster.dir, f"ckpt-{time.time_ns()}"), 400, every,
        snapshot_every)))
    rec = Recorder(cluster.address, job.job_id)
    rec.start()
    rec.done.wait(600)
    final = cluster.get(job.job_id)
    assert final.state == pb.SUCCEEDED, (final.state, final.reason)
    return rec.step_time(100, 400)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--skip_recovery", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    global BATCH
    BATCH = args.batch
    print(f"batch {BATCH}; model 4 stages (3 x 256-768-256 blocks, 1 small), "
          "4 worker processes, --threads=1 each")

    print("== Recovery after SIGKILL of one of 4 workers (spare registered), "
          f"{args.trials} trials each; medians")
    for label, every, snap in (() if args.skip_recovery else (
            ("checkpoints every 20", 20, 0),
            ("+ snapshots every 5", 20, 5),
            ("+ snapshots every step", 20, 1))):
        trials = [recovery_trial(every, snap, rng) for _ in range(args.trials)]
        med = {k: statistics.median(t[k] for t in trials)
               for k in ("detect", "reschedule", "restore", "warmup", "total",
                         "redone_steps", "lost_s", "step_ms")}
        print(f"{label:24s} total {med['total']:.2f} s = detect {med['detect']:.3f} "
              f"+ reschedule {med['reschedule']:.3f} + restore {med['restore']:.3f} "
              f"+ warm-up {med['warmup']:.3f}; redone {med['redone_steps']:.0f} steps "
              f"= {med['lost_s']:.2f} s of work (step {med['step_ms']:.1f} ms); "
              f"from snapshots: {[t['from_snapshot'] for t in trials]}; "
              f"snapshot bytes/stage: {trials[0]['snapshot_bytes']}")
        sys.stdout.flush()

    print(f"\n== Step time, steps 100-400, 4 workers; {args.rounds} interleaved "
          "rounds; medians")
    configs = (("no checkpoints", 0, 0), ("async checkpoints every 20", 20, 0),
               ("snapshots every 5", 0, 5), ("snapshots every step", 0, 1))
    times = {c[0]: [] for c in configs}
    cluster = Cluster(workers=4)
    try:
        for _ in range(args.rounds):
            for label, every, snap in configs:
                times[label].append(overhead_run(cluster, every, snap))
    finally:
        cluster.stop()
    base = statistics.median(times["no checkpoints"])
    for label, _, _ in configs:
        m = statistics.median(times[label])
        print(f"{label:28s} {m * 1000:7.2f} ms/step  x{m / base:.3f}  "
              f"(runs: {', '.join(f'{t * 1000:.2f}' for t in times[label])})")


if __name__ == "__main__":
    main()
