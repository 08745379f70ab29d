"""`trainyard watch` survives a dropped stream: the controller is killed
(SIGKILL) and restarted on the same port mid-watch; the CLI reconnects,
resumes after the last step it printed, prints no step twice and none out of
order. The job itself does not notice: its workers train on while no
controller listens, the restarted controller re-adopts it, and it SUCCEEDS
(the watch exits 0)."""
import re
import signal
import subprocess
import time

from cluster import CLI_BIN, Cluster, pb, small_spec, spec_from_json, wait_for


def first_line(proc):
    """Waits for the watch's first line: it has read the job (an RPC without
    retries) and its stream is open, so killing the controller now tests the
    reconnect rather than that first call. A fixed sleep was not enough on a
    loaded machine."""
    line = proc.stdout.readline()
    assert line, "watch printed nothing"
    return line


cluster = Cluster(workers=2)
STEPS = 12000
job = cluster.submit(spec_from_json(small_spec(stages=2, steps=STEPS, name="watched",
                                               samples=2048, features=64, batch=128)))
wait_for(lambda: cluster.get(job.job_id).steps_completed >= 5, 60, "5 steps")
watch = subprocess.Popen([CLI_BIN, "watch", job.job_id, *cluster.cli_flags()],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
head = first_line(watch)
port = int(cluster.address.rsplit(":", 1)[1])
cluster.kill_controller(signal.SIGKILL)
time.sleep(0.5)
cluster.start_controller(port=port)
out, _ = watch.communicate(timeout=120)
out = head + out
print(out[-2000:])
steps = [int(m) for m in re.findall(r"^step (\d+)/", out, re.M)]
assert steps, "no steps printed"
assert steps == list(range(steps[0], steps[-1] + 1)), "a step was repeated or skipped"
assert steps[-1] == STEPS, steps[-1]
# Each quantity once: the plugin's own "loss" metric equals the step's loss.
step_lines = [l for l in out.splitlines() if l.startswith("step ")]
assert all(l.count("loss=") == 1 for l in step_lines), step_lines[:2]
assert "SUCCEEDED" in out, out[-500:]
assert watch.returncode == 0, watch.returncode
final = cluster.get(job.job_id)
assert final.state == pb.SUCCEEDED, final
assert final.restarts == 0, final
print(f"ok: watch printed steps {steps[0]}..{steps[-1]} once each across the "
      f"controller restart, then: {final.reason}")

# A controller that is gone for good: watch gives up after --reconnect_s and
# exits 3 instead of hanging.
cluster.start_worker("w2")
cluster.start_worker("w3")
job2 = cluster.submit(spec_from_json(small_spec(stages=2, steps=100000, name="orphaned",
                                                samples=2048, features=64, batch=128)))
wait_for(lambda: cluster.get(job2.job_id).steps_completed >= 3, 60, "3 steps")
watch = subprocess.Popen([CLI_BIN, "watch", job2.job_id, *cluster.cli_flags(),
                          "--reconnect_s=3"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
head = first_line(watch)
cluster.kill_controller(signal.SIGKILL)
t0 = time.time()
out, _ = watch.communicate(timeout=60)
out = head + out
took = time.time() - t0
assert watch.returncode == 3, (watch.returncode, out[-500:])
assert "cannot reach" in out, out[-500:]
print(f"PASS: with the controller gone, watch gave up after {took:.1f} s (--reconnect_s=3), exit 3")
