"""Jobs that survive lost workers, hung workers, a lost or stalled
controller and a corrupt checkpoint, and finish bit for bit as if nothing happened.

One scenario per run (the first argument):
  chaos    a 4-stage job over 5 workers (one spare), checkpoints every 20
           steps and snapshots every 5: three SIGKILLs of random workers of
           the gang and one SIGKILL of the controller, at random steps (a
           seeded choice, printed; CHAOS_SEED overrides it). Each killed
           worker comes back a moment later, as a pod would.
  hung     one worker of the gang is SIGSTOPped (hung, not dead), then
           SIGCONTed once the job runs again without it.
  stall    the controller is SIGSTOPped for three heartbeat timeouts, then
           SIGCONTed: it blames no worker for its own silence, and the job
           goes on without a restart.
  corrupt  the newest checkpoint is truncated and the one before it gets one
           flipped bit, then a worker is killed: the job falls back two
           checkpoints, says why, and goes on.
  snapshot with in-memory snapshots every 5 steps, two SIGKILLs of workers:
           each restart resumes from the snapshots the surviving workers
           hold (the killed stage's copy is on its neighbour), a few steps
           back rather than at the last checkpoint.
  exhausted recovery.max_restarts 2 and three kills: FAILED, naming every
           attempt.
In every scenario but the last the job SUCCEEDS by itself, its final weights
(the last checkpoint's stage files, byte for byte) and every step's loss are
equal to an uninterrupted `trainyard train` of the same spec, and three
watchers (each reconnecting after a dropped stream) saw every step exactly
once, in order.
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc

from cluster import (CLI_BIN, PLUGIN_DIR, TERMINAL, Cluster, pb, pb_grpc,
                     spec_from_json, wait_for, wide_spec)

SCENARIO = sys.argv[1] if len(sys.argv) > 1 else "chaos"
STEPS = 600
EVERY = 20
WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def make_spec(ckpt_dir, max_restarts=6, snapshot_every=0):
    return wide_spec(f"recovery-{SCENARIO}", STEPS, eval_every=100,
                     checkpoint={"dir": ckpt_dir, "every": EVERY},
                     recovery={"maxRestarts": max_restarts, "backoffMs": 200,
                               "snapshotEvery": snapshot_every})


def stage_files(ckpt_dir, step):
    d = os.path.join(ckpt_dir, f"step_{step:08d}")
    return [open(os.path.join(d, f"stage_{k}.safetensors"), "rb").read()
            for k in range(4)]


def reference():
    """The uninterrupted run: per-step losses and final stage files."""
    ckpt = os.path.join(WORK, "reference-ckpt")
    spec_path = os.path.join(WORK, "reference.json")
    with open(spec_path, "w") as f:
        json.dump(make_spec(ckpt), f)
    metrics = os.path.join(WORK, "reference.jsonl")
    run = subprocess.run([CLI_BIN, "train", "--spec", spec_path, "--metrics_out",
                          metrics, "--threads", "1", f"--plugin_dir={PLUGIN_DIR}"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    losses = {}
    for line in open(metrics):
        rec = json.loads(line)
        if "loss" in rec:
            losses[rec["step"]] = rec["loss"]
    assert sorted(losses) == list(range(1, STEPS + 1)), len(losses)
    return losses, stage_files(ckpt, STEPS)


class Watcher(threading.Thread):
    """Follows a job's WatchJob stream to its end, reconnecting (from the
    step after the last one it saw) whenever the stream drops."""

    def __init__(self, address, job_id):
        super().__init__(daemon=True)
        self.address, self.job_id = address, job_id
        self.steps, self.losses, self.recoveries = [], {}, {}
        self.reconnects, self.final, self.error = 0, None, None

    def run(self):
        try:
            self._follow()
        except Exception as e:  # reported by the main thread
            self.error = e

    def _follow(self):
        deadline = time.time() + 600
        while time.time() < deadline:
            channel = grpc.insecure_channel(self.address)
            stub = pb_grpc.JobServiceStub(channel)
            last = self.steps[-1] if self.steps else 0
            try:
                for e in stub.WatchJob(pb.WatchJobRequest(job_id=self.job_id,
                                                          from_step=last + 1),
                                       timeout=600, wait_for_ready=True):
                    kind = e.WhichOneof("event")
                    if kind == "step":
                        self.steps.append(e.step.step)
                        self.losses[e.step.step] = e.step.loss
                    elif kind == "recovery":
                        self.recoveries[e.recovery.attempt] = e.recovery
                    elif kind == "state" and e.state.state in TERMINAL:
                        self.final = e.state
                        return
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.CANCELLED,
                                      grpc.StatusCode.UNKNOWN):
                    raise
            finally:
                channel.close()
            self.reconnects += 1
            time.sleep(0.2)
        raise AssertionError(f"watcher of {self.job_id}: no terminal state in 600 s")


def gang_worker_names(cluster, job_id):
    names = {w.worker_id: w.name for w in cluster.jobs.ListWorkers(
        pb.ListWorkersRequest(), timeout=10).workers}
    return [names[w] for w in cluster.get(job_id).workers if w in names]


def wait_running_at(cluster, job_id, step, timeout=180):
    return wait_for(lambda: (lambda j: j if j.state == pb.RUNNING and
                             j.steps_completed >= step else None)(
        cluster.get(job_id)), timeout, f"job {job_id} RUNNING at step >= {step}")


def wait_restarts(cluster, job_id, n, timeout=60):
    return wait_for(lambda: (lambda j: j if j.restarts >= n or j.state in TERMINAL
                             else None)(cluster.get(job_id)),
                    timeout, f"restart {n} of job {job_id}")


def newest_committed(ckpt_dir):
    steps = sorted(int(n[5:]) for n in os.listdir(ckpt_dir)
                   if n.startswith("step_") and n[5:].isdigit() and
                   os.path.exists(os.path.join(ckpt_dir, n, "manifest.json")))
    return steps


def check_result(cluster, job_id, ckpt_dir, watchers, ref_losses, ref_files,
                 restarts):
    final = cluster.wait_state(job_id, TERMINAL, 300)
    assert final.state == pb.SUCCEEDED, (final.state, final.reason,
                                         cluster.log("controller"))
    assert final.restarts == restarts, (final.restarts, list(final.restart_reasons))
    for w in watchers:
        w.join(60)
        assert not w.is_alive(), "a watcher did not finish"
        assert w.error is None, w.error
        assert w.final.state == pb.SUCCEEDED, w.final
        assert w.steps == list(range(1, STEPS + 1)), (
            "a watcher saw a step twice, out of order or not at all",
            [s for i, s in enumerate(w.steps) if s != i + 1][:10])
        bad = [s for s in range(1, STEPS + 1) if w.losses[s] != ref_losses[s]]
        assert not bad, ("losses differ from the uninterrupted run at steps", bad[:10])
        assert sorted(w.recoveries) == list(range(1, restarts + 1)), w.recoveries
    files = stage_files(ckpt_dir, STEPS)
    for k in range(4):
        assert files[k] == ref_files[k], f"final weights of stage {k} differ"
    rec = watchers[0].recoveries
    for a in sorted(rec):
        r = rec[a]
        assert 0 <= r.resume_step <= r.detected_step, r
        if not r.from_snapshot:
            assert r.resume_step % EVERY == 0, r
        print(f"  restart {a}: resumed after step {r.resume_step} from "
              f"{'snapshots' if r.from_snapshot else 'a checkpoint'} (loss "
              f"noticed after step {r.detected_step}); reschedule "
              f"{r.reschedule_s:.2f} s, restore {r.restore_s:.2f} s, first step "
              f"{r.warmup_s:.2f} s later; cause: {r.cause}")
    print(f"  watcher reconnects: {[w.reconnects for w in watchers]}")
    return final


def start(cluster, spec):
    job = cluster.submit(spec_from_json(spec))
    watchers = [Watcher(cluster.address, job.job_id) for _ in range(3)]
    for w in watchers:
        w.start()
    return job.job_id, watchers


def chaos(ref_losses, ref_files):
    seed = int(os.environ.get("CHAOS_SEED", "20261123"))
    rng = random.Random(seed)
    kinds = ["worker", "worker", "worker", "controller"]
    rng.shuffle(kinds)
    window = (STEPS - 150) // 4
    points = [60 + i * window + rng.randrange(window - 20) for i in range(4)]
    print(f"chaos seed {seed}: " +
          ", ".join(f"SIGKILL {k} at step {p}" for k, p in zip(kinds, points)))
    cluster = Cluster(workers=5)
    ckpt = os.path.join(WORK, "chaos-ckpt")
    # Snapshots too, so that a controller restart must rebuild what the
    # workers hold from their resent reports.
    job_id, watchers = start(cluster, make_spec(ckpt, snapshot_every=5))
    restarts = 0
    for kind, point in zip(kinds, points):
        wait_running_at(cluster, job_id, point)
        if kind == "controller":
            port = int(cluster.address.rsplit(":", 1)[1])
            step = cluster.get(job_id).steps_completed
            cluster.kill_controller(signal.SIGKILL)
            print(f"  killed the controller after step {step}")
            time.sleep(1.0)
            cluster.start_controller(port=port)
            continue
        victim = rng.choice(gang_worker_names(cluster, job_id))
        step = cluster.get(job_id).steps_completed
        cluster.kill_worker(victim, signal.SIGKILL)
        print(f"  killed worker {victim} after step {step}")
        restarts += 1
        wait_restarts(cluster, job_id, restarts)
        cluster.start_worker(victim)  # the pod comes back
    final = check_result(cluster, job_id, ckpt, watchers, ref_losses, ref_files,
                         restarts=3)
    print(f"PASS chaos: SUCCEEDED after {final.restarts} restarts and a controller "
          f"restart; {STEPS} losses and the final weights bitwise equal to the "
          "uninterrupted run; 3 watchers saw every step once, in order")


def hung(ref_losses, ref_files):
    cluster = Cluster(workers=5)
    ckpt = os.path.join(WORK, "hung-ckpt")
    job_id, watchers = start(cluster, make_spec(ckpt))
    wait_running_at(cluster, job_id, 150)
    victim = random.Random(5).choice(gang_worker_names(cluster, job_id))
    proc = cluster.workers[victim]
    t0 = time.time()
    proc.send_signal(signal.SIGSTOP)
    print(f"  SIGSTOPped worker {victim} after step {cluster.get(job_id).steps_completed}")
    wait_restarts(cluster, job_id, 1)
    print(f"  restart began {time.time() - t0:.1f} s later "
          f"(heartbeat timeout {cluster.heartbeat_timeout_ms} ms)")
    wait_running_at(cluster, job_id, 0)
    proc.send_signal(signal.SIGCONT)  # it wakes to find its stage given away
    final = check_result(cluster, job_id, ckpt, watchers, ref_losses, ref_files,
                         restarts=1)
    assert "no heartbeat" in final.restart_reasons[0], final.restart_reasons
    print("PASS hung: SUCCEEDED after the hung worker was replaced; bitwise equal "
          "to the uninterrupted run")


def stall(ref_losses, ref_files):
    cluster = Cluster(workers=4)
    ckpt = os.path.join(WORK, "stall-ckpt")
    job_id, watchers = start(cluster, make_spec(ckpt))
    wait_running_at(cluster, job_id, 150)
    workers = sorted((w.worker_id, w.name) for w in cluster.jobs.ListWorkers(
        pb.ListWorkersRequest(), timeout=10).workers)
    pause = 3 * cluster.heartbeat_timeout_ms / 1000
    step = cluster.get(job_id).steps_completed
    cluster.controller.send_signal(signal.SIGSTOP)
    time.sleep(pause)
    cluster.controller.send_signal(signal.SIGCONT)
    print(f"  SIGSTOPped the controller for {pause:.1f} s after step {step}")
    check_result(cluster, job_id, ckpt, watchers, ref_losses, ref_files,
                 restarts=0)
    after = sorted((w.worker_id, w.name) for w in cluster.jobs.ListWorkers(
        pb.ListWorkersRequest(), timeout=10).workers)
    assert after == workers, (workers, after)
    log = cluster.log("controller")
    assert "the controller did not run for" in log, log
    assert " lost: " not in log, log
    print("PASS stall: no worker lost, no restart; bitwise equal to the "
          "uninterrupted run")


def corrupt(ref_losses, ref_files):
    cluster = Cluster(workers=5)
    ckpt = os.path.join(WORK, "corrupt-ckpt")
    job_id, watchers = start(cluster, make_spec(ckpt))
    wait_running_at(cluster, job_id, 150)
    gang = gang_worker_names(cluster, job_id)
    # Freeze the gang so that no checkpoint is committed while we damage
    # the two newest, then kill one of it and let the rest go.
    for name in gang:
        cluster.workers[name].send_signal(signal.SIGSTOP)
    steps = newest_committed(ckpt)
    newest, before = steps[-1], steps[-2]
    path = os.path.join(ckpt, f"step_{newest:08d}", "stage_1.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    path = os.path.join(ckpt, f"step_{before:08d}", "stage_2.safetensors")
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))
    cluster.kill_worker(gang[3], signal.SIGKILL)
    for name in gang[:3]:
        cluster.workers[name].send_signal(signal.SIGCONT)
    print(f"  truncated step {newest} (stage 1), flipped a bit in step {before} "
          f"(stage 2), killed {gang[3]}")
    wait_restarts(cluster, job_id, 1)
    final = check_result(cluster, job_id, ckpt, watchers, ref_losses, ref_files,
                         restarts=1)
    r = watchers[0].recoveries[1]
    assert r.resume_step == before - EVERY, (r.resume_step, newest, before)
    aside = sorted(n for n in os.listdir(ckpt) if ".bad-" in n)
    assert [n.split(".")[0] for n in aside] == [f"step_{before:08d}", f"step_{newest:08d}"], aside
    logs = "".join(open(os.path.join(cluster.dir, f)).read()
                   for f in os.listdir(cluster.dir) if f.endswith(".log"))
    assert f"step {newest}:" in logs and "(truncated)" in logs, \
        "the truncation's reason is not logged"
    assert f"step {before}:" in logs and "checksum mismatch" in logs, \
        "the flipped bit's reason is not logged"
    print(f"PASS corrupt: both damaged checkpoints set aside ({aside}), resumed after "
          f"step {r.resume_step}; bitwise equal to the uninterrupted run")


def snapshot(ref_losses, ref_files):
    cluster = Cluster(workers=5)
    ckpt = os.path.join(WORK, "snapshot-ckpt")
    job_id, watchers = start(cluster, make_spec(ckpt, snapshot_every=5))
    rng = random.Random(11)
    for n, point in enumerate((170, 390), start=1):
        wait_running_at(cluster, job_id, point)
        victim = rng.choice(gang_worker_names(cluster, job_id))
        step = cluster.get(job_id).steps_completed
        cluster.kill_worker(victim, signal.SIGKILL)
        print(f"  killed worker {victim} after step {step}")
        wait_restarts(cluster, job_id, n)
        cluster.start_worker(victim)
    check_result(cluster, job_id, ckpt, watchers, ref_losses, ref_files,
                 restarts=2)
    for a, r in sorted(watchers[0].recoveries.items()):
        assert r.from_snapshot and r.resume_step % 5 == 0, r
        # Work redone: at most two snapshot intervals (stages a step apart,
        # the newest snapshot not yet on every worker), never a checkpoint
        # interval.
        assert r.detected_step - r.resume_step <= 10, r
    print("PASS snapshot: both restarts resumed from in-memory snapshots; bitwise "
          "equal to the uninterrupted run")


def exhausted():
    cluster = Cluster(workers=4)
    spec = make_spec(os.path.join(WORK, "exhausted-ckpt"), max_restarts=2)
    spec["steps"] = 100000
    job = cluster.submit(spec_from_json(spec))
    extra = 0
    for attempt in range(3):
        wait_running_at(cluster, job.job_id, 0)
        victim = gang_worker_names(cluster, job.job_id)[1]
        cluster.kill_worker(victim, signal.SIGKILL)
        cluster.start_worker(f"extra{extra}")
        extra += 1
        if attempt < 2:
            wait_restarts(cluster, job.job_id, attempt + 1)
    failed = cluster.wait_state(job.job_id, TERMINAL, 60)
    assert failed.state == pb.FAILED, (failed.state, failed.reason)
    assert failed.restarts == 2 and len(failed.restart_reasons) == 2, failed
    assert "gave up after 2 restart(s)" in failed.reason, failed.reason
    for part in ("restart 1 after: worker", "restart 2 after: worker", "then: worker"):
        assert part in failed.reason, (part, failed.reason)
    print(f"PASS exhausted: FAILED: {failed.reason}")


if SCENARIO == "exhausted":
    exhausted()
else:
    losses, files = reference()
    {"chaos": chaos, "hung": hung, "stall": stall, "corrupt": corrupt,
     "snapshot": snapshot}[SCENARIO](losses, files)
