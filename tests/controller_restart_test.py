"""Controller killed with SIGKILL and restarted: queued and finished jobs and
their histories are still there, and the queued job runs afterwards."""
import signal

from cluster import Cluster, pb, small_spec, spec_from_json, steps_of, wait_for

cluster = Cluster(workers=1)
done = cluster.submit(spec_from_json(small_spec(stages=1, steps=8, name="finished")))
before = cluster.watch(done.job_id)
assert before[-1].state.state == pb.SUCCEEDED, before[-1]
queued = cluster.submit(spec_from_json(small_spec(stages=2, steps=6, name="queued")))
assert cluster.get(queued.job_id).state == pb.QUEUED

cluster.kill_controller(signal.SIGKILL)
for name in list(cluster.workers):
    cluster.kill_worker(name)
cluster.start_controller()

after_done = cluster.get(done.job_id)
assert after_done.state == pb.SUCCEEDED, after_done
assert after_done.spec.name == "finished"
assert after_done.steps_completed == 8
replay = cluster.watch(done.job_id)
assert len(steps_of(before)) == 8
assert steps_of(replay) == steps_of(before), "history changed"
assert cluster.get(queued.job_id).state == pb.QUEUED
listed = cluster.jobs.ListJobs(pb.ListJobsRequest(page_size=10), timeout=10)
assert {j.job_id for j in listed.jobs} == {done.job_id, queued.job_id}

cluster.start_worker("x0")
cluster.start_worker("x1")
final = cluster.wait_state(queued.job_id, (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED))
assert final.state == pb.SUCCEEDED, (final.state, final.reason)
print("PASS: finished job, its 8-step history and the queued job survived SIGKILL; "
      "the queued job then ran")
