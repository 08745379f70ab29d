"""A worker asked to stop (SIGTERM, as Kubernetes does when it deletes a
pod) lets its stage finish the step it is in, tells the controller why it
leaves, and exits 0 within its grace period; the job restarts on the other
workers and completes."""
import os
import signal
import time

from cluster import TERMINAL, Cluster, pb, small_spec, spec_from_json, wait_for

cluster = Cluster(workers=3)
wait_for(lambda: len(cluster.jobs.ListWorkers(pb.ListWorkersRequest(),
                                              timeout=10).workers) == 3,
         30, "3 workers")

# 1. No restarts allowed: the job ends with the worker's own reason.
spec = small_spec(stages=1, steps=1000000, name="drain-fail")
spec["recovery"] = {"maxRestarts": 0}
job = cluster.submit(spec_from_json(spec))
wait_for(lambda: cluster.get(job.job_id).steps_completed >= 3, 60, "3 steps")
worker_id = cluster.get(job.job_id).workers[0]
names = {w.worker_id: w.name for w in cluster.jobs.ListWorkers(
    pb.ListWorkersRequest(), timeout=10).workers}
name = names[worker_id]
proc = cluster.workers[name]
start = time.time()
proc.send_signal(signal.SIGTERM)
rc = proc.wait(timeout=30)
took = time.time() - start
del cluster.workers[name]
assert rc == 0, f"exit status {rc}"
assert took < 10, f"took {took:.1f} s to stop"
final = cluster.wait_state(job.job_id, TERMINAL, timeout=60)
assert final.state == pb.FAILED, final
assert "is shutting down (asked to stop)" in final.reason, final.reason
assert "after finishing its current step" in final.reason, final.reason
log = cluster.log(name)
assert "finishes its current step" in log, log[-2000:]
print(f"ok: SIGTERM: stage ended after its current step, worker exited 0 in "
      f"{took:.2f} s; job reason: {final.reason[:160]}")

# 2. With restarts: a 2-stage job moves to the two workers left... after a
# third comes, since the drained one is gone: start a replacement.
spec = small_spec(stages=2, steps=400, name="drain-recover")
spec["recovery"] = {"maxRestarts": 2, "backoffMs": 100}
job = cluster.submit(spec_from_json(spec))
wait_for(lambda: cluster.get(job.job_id).steps_completed >= 3, 60, "3 steps")
worker_id = cluster.get(job.job_id).workers[1]
names = {w.worker_id: w.name for w in cluster.jobs.ListWorkers(
    pb.ListWorkersRequest(), timeout=10).workers}
proc = cluster.workers.pop(names[worker_id])
proc.send_signal(signal.SIGTERM)
assert proc.wait(timeout=30) == 0
cluster.start_worker("w3")
final = cluster.wait_state(job.job_id, TERMINAL, timeout=120)
assert final.state == pb.SUCCEEDED, final
# The restart's recorded cause is whichever stage's end reached the
# controller first: the drained worker's own report, or its peer's failure
# when the drained stage left (which carries the drain's reason when the
# abort frame arrives before the connection closes).
assert final.restarts == 1, list(final.restart_reasons)
controller_log = open(os.path.join(cluster.dir, "controller.log"),
                      errors="replace").read()
assert f"({names[worker_id]}) is shutting down: no new stages for it" in \
    controller_log, controller_log[-3000:]
print(f"ok: a drained worker's job restarted once and SUCCEEDED "
      f"({final.restart_reasons[0][:160]})")
print("PASS")
