"""Data-parallel replicas across real worker processes: a 2-stage x
2-replica job on 4 workers trains bitwise as `trainyard train` of the same
spec (and as one replica), under 1F1B and under the schedules with model
chunks (interleaved 1F1B, ZB-V: 2 chunks per worker, whose messages name
their chunk on the wire), evals included; a replica's worker lost mid-run
restarts the whole gang from its checkpoint, the cause naming that worker,
and the job still ends bitwise equal."""
import json
import os
import subprocess
import tempfile

from cluster import (CLI_BIN, PLUGIN_DIR, TERMINAL, Cluster, pb, small_spec,
                     spec_from_json, wait_for)

WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
STEPS = 24


def spec(name, replicas, checkpoint=None, schedule="1f1b"):
    # 4 blocks on 2 stages: 2 chunks of one block each under interleaved/zbv.
    s = small_spec(stages=4, steps=STEPS, name=name, microbatches=4, batch=32,
                   samples=512)
    s["parallelism"]["stages"] = 2
    s["parallelism"]["schedule"] = schedule
    s["parallelism"]["replicas"] = replicas
    s["parallelism"]["accumulation"] = "tree"
    s["data"]["evalEvery"] = 8
    if checkpoint:
        s["checkpoint"] = {"dir": checkpoint, "every": 4, "resume": "latest"}
        s["recovery"] = {"maxRestarts": 3, "backoffMs": 100}
    return s


def local_losses(obj, tag):
    """trainyard train's step losses, and its eval losses keyed by -step."""
    path = os.path.join(WORK, f"{tag}.json")
    with open(path, "w") as f:
        json.dump(obj, f)
    out = os.path.join(WORK, f"{tag}.jsonl")
    run = subprocess.run([CLI_BIN, "train", "--spec", path, "--metrics_out", out,
                          "--threads", "1", f"--plugin_dir={PLUGIN_DIR}"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = {}
    for r in map(json.loads, open(out)):
        if "loss" in r:
            got[r["step"]] = r["loss"]
        if "eval_loss" in r:
            got[-r["step"]] = r["eval_loss"]
    return got


def watched_losses(cluster, job_id):
    losses, recoveries, final = {}, [], None
    for e in cluster.watch(job_id, timeout=300):
        kind = e.WhichOneof("event")
        if kind == "step":
            losses[e.step.step] = e.step.loss
        elif kind == "eval":
            losses[-e.eval.step] = e.eval.loss
        elif kind == "recovery":
            recoveries.append(e.recovery)
        elif kind == "state" and e.state.state in TERMINAL:
            final = e.state
    return losses, recoveries, final


one = local_losses(spec("one", 1), "one")
assert sorted(k for k in one if k > 0) == list(range(1, STEPS + 1)), sorted(one)
assert sorted(-k for k in one if k < 0) == [8, 16, 24], sorted(one)
for schedule in ("1f1b", "interleaved", "zbv"):
    two = local_losses(spec("two", 2, schedule=schedule), f"two-{schedule}")
    assert two == one, f"trainyard train: R=2 {schedule} must be R=1's bits"

cluster = Cluster(workers=4)
wait_for(lambda: len(cluster.jobs.ListWorkers(pb.ListWorkersRequest(),
                                              timeout=10).workers) == 4,
         30, "4 workers")
for schedule in ("1f1b", "interleaved", "zbv"):
    job = cluster.submit(spec_from_json(spec(f"service-{schedule}", 2,
                                             schedule=schedule)))
    losses, _, final = watched_losses(cluster, job.job_id)
    assert final.state == pb.SUCCEEDED, (schedule, final)
    assert losses == one, (schedule, {k: (losses.get(k), one[k]) for k in one
                                      if losses.get(k) != one[k]})
    got = cluster.get(job.job_id)
    assert len(got.workers) == 4, got.workers
    print(f"ok: {schedule}: 2 stages x 2 replicas on 4 workers, {STEPS} steps "
          f"and 3 evals bitwise equal to trainyard train (R=1, 1F1B)")

# A worker of replica 1 is lost mid-run; a replacement registers; the gang
# restarts from the newest checkpoint and still matches.
ckpt = os.path.join(WORK, "ckpt")
job = cluster.submit(spec_from_json(spec("lost", 2, checkpoint=ckpt)))
wait_for(lambda: cluster.get(job.job_id).steps_completed >= 6, 120, "6 steps")
victim_id = cluster.get(job.job_id).workers[3]  # rank 3: replica 1, stage 1
names = {w.worker_id: w.name for w in cluster.jobs.ListWorkers(
    pb.ListWorkersRequest(), timeout=10).workers}
cluster.kill_worker(names[victim_id])
cluster.start_worker("w4")
losses, recoveries, final = watched_losses(cluster, job.job_id)
assert final.state == pb.SUCCEEDED, final
assert recoveries, "the lost worker must have restarted the gang"
assert victim_id in recoveries[0].cause, recoveries[0].cause
assert losses == one, {k: (losses.get(k), one[k]) for k in one
                       if losses.get(k) != one[k]}
print(f"ok: lost replica worker {victim_id} ({recoveries[0].cause[:80]}...); "
      f"restart {recoveries[0].attempt} resumed after step "
      f"{recoveries[0].resume_step}; all {STEPS} steps bitwise equal")
print("PASS")
