"""Cancel mid-run; with recovery off (recovery.max_restarts 0), a worker
killed mid-run fails its job at once with a reason and the surviving workers
run the next job; unknown plugin, bad spec and an impossible gang each end
with a clear status, and none of them is restarted."""
import time

import grpc

from cluster import Cluster, pb, small_spec, spec_from_json, wait_for

cluster = Cluster(workers=2, heartbeat_timeout_ms=2000)
long_job = small_spec(stages=2, steps=100000, name="long", samples=2048,
                      features=64, batch=128)

# 1. Cancel mid-run: the job ends CANCELLED and both workers are free again.
job = cluster.submit(spec_from_json(long_job))
wait_for(lambda: cluster.get(job.job_id).steps_completed >= 3, 60, "3 steps")
t0 = time.time()
cluster.jobs.CancelJob(pb.CancelJobRequest(job_id=job.job_id, reason="test cancel"),
                       timeout=10)
cancelled = cluster.wait_state(job.job_id, (pb.CANCELLED, pb.FAILED, pb.SUCCEEDED), 30)
assert cancelled.state == pb.CANCELLED, cancelled
assert "test cancel" in cancelled.reason, cancelled.reason
nxt = cluster.submit(spec_from_json(small_spec(stages=2, steps=4, name="after-cancel")))
wait_for(lambda: cluster.get(nxt.job_id).steps_completed >= 1, 30, "the next job's first step")
freed_s = time.time() - t0
done = cluster.wait_state(nxt.job_id, (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED), 60)
assert done.state == pb.SUCCEEDED, (done.state, done.reason)
print(f"cancel: CANCELLED ({cancelled.reason}); the next job on the same two "
      f"workers completed its first step {freed_s:.2f} s after the cancel")

# 2. Recovery off: a worker killed mid-run fails the job, naming the worker
# and stage (recovery_test.py covers the automatic restart).
fail_fast = dict(long_job, recovery={"maxRestarts": 0})
job = cluster.submit(spec_from_json(fail_fast))
wait_for(lambda: cluster.get(job.job_id).steps_completed >= 3, 60, "3 steps")
workers = list(cluster.get(job.job_id).workers)
cluster.kill_worker("w1")
failed = cluster.wait_state(job.job_id, (pb.FAILED, pb.CANCELLED, pb.SUCCEEDED), 30)
assert failed.state == pb.FAILED, failed
assert failed.restarts == 0, failed
assert "stage" in failed.reason and "lost" in failed.reason, failed.reason
assert any(w in failed.reason for w in workers), (workers, failed.reason)
print(f"worker lost: FAILED: {failed.reason}")
cluster.start_worker("w2")
nxt = cluster.submit(spec_from_json(small_spec(stages=2, steps=4, name="after-loss")))
done = cluster.wait_state(nxt.job_id, (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED), 60)
assert done.state == pb.SUCCEEDED, (done.state, done.reason)

# 3. Unknown plugin: the job fails, naming the plugin.
job = cluster.submit(spec_from_json(small_spec(stages=2, steps=4, plugin="no_such_task")))
failed = cluster.wait_state(job.job_id, (pb.FAILED, pb.SUCCEEDED, pb.CANCELLED), 60)
assert failed.state == pb.FAILED and "no_such_task" in failed.reason, failed
# A missing plugin would fail again: not restarted, although recovery is on.
assert failed.restarts == 0 and "not restarted" in failed.reason, failed
print(f"unknown plugin: FAILED: {failed.reason}")

# 4. Bad spec: INVALID_ARGUMENT carrying every field path.
bad = small_spec(stages=2, steps=0)
bad["model"]["blocks"][0]["ffnHiddenSize"] = -4
bad["parallelism"]["schedule"] = "zb"
try:
    cluster.submit(spec_from_json(bad))
    raise AssertionError("bad spec accepted")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    for path in ("steps", "model.blocks[0].ffn_hidden_size", "parallelism.schedule"):
        assert path in e.details(), (path, e.details())
    print("bad spec: INVALID_ARGUMENT:", e.details().replace("\n", " | "))

# 5. Impossible gang: more stages than workers; the job says so.
job = cluster.submit(spec_from_json(small_spec(stages=5, steps=4)))
queued = wait_for(lambda: (lambda j: j if "needs 5" in j.reason else None)(
    cluster.get(job.job_id)), 10, "a reason on the queued job")
assert queued.state == pb.QUEUED, queued
print(f"impossible gang: QUEUED: {queued.reason}")
print("PASS")
