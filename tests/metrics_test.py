"""Prometheus /metrics on the controller and on each worker: scraped during
and after a real 2-stage job, parsed with the prometheus_client package's
text parser (a real Prometheus exposition parser), values checked against
the job."""
import sys
import time
import urllib.request

from cluster import Cluster, pb, small_spec, spec_from_json, wait_for

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("SKIP: prometheus_client is not installed (tools/setup.sh installs it)")
    sys.exit(0)


def scrape(url):
    """{(sample name, frozenset(labels)): value} of one scrape."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


STEPS = 2000  # long enough to be scraped while it runs
cluster = Cluster(workers=2, metrics=True)
controller = cluster.metrics_url("controller")
workers = [cluster.metrics_url(n) for n in ("w0", "w1")]
wait_for(lambda: value(scrape(controller), "trainyard_workers", device="cpu",
                       state="idle") == 2, 30, "2 idle workers in /metrics")

job = cluster.submit(spec_from_json(small_spec(stages=2, steps=STEPS, name="metrics")))
wait_for(lambda: cluster.get(job.job_id).steps_completed >= 3, 60, "3 steps")
during = scrape(controller)
assert value(during, "trainyard_jobs", state="RUNNING") == 1, during
assert value(during, "trainyard_workers", device="cpu", state="busy") == 2
done = cluster.wait_state(job.job_id, (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED))
assert done.state == pb.SUCCEEDED, done

after = scrape(controller)
assert value(after, "trainyard_jobs", state="SUCCEEDED") == 1, after
assert value(after, "trainyard_jobs", state="RUNNING") == 0
assert value(after, "trainyard_jobs_queued") == 0
assert value(after, "trainyard_submit_seconds_count") == 1
assert 0 < value(after, "trainyard_submit_seconds_sum") < 5
assert value(after, "trainyard_job_restarts_total") == 0
assert value(after, "trainyard_watchers") == 0

steps_by_stage = {}
for url in workers:
    w = scrape(url)
    assert value(w, "trainyard_worker_busy") == 0
    # CPU workers have no device memory to report.
    assert value(w, "trainyard_worker_device_memory_bytes", kind="in_use") is None
    for stage in ("0", "1"):
        n = value(w, "trainyard_worker_steps_total", stage=stage)
        if n is None:
            continue
        steps_by_stage[stage] = n
        assert value(w, "trainyard_worker_step_seconds_count", stage=stage) == STEPS
        for phase in ("forward", "backward", "comm", "idle", "optimizer"):
            t = value(w, "trainyard_worker_phase_seconds_total", stage=stage,
                      phase=phase)
            assert t is not None and t >= 0, (phase, t)
        assert value(w, "trainyard_worker_phase_seconds_total", stage=stage,
                     phase="forward") > 0
        frac = value(w, "trainyard_worker_bubble_fraction", stage=stage)
        assert 0 <= frac <= 1, frac
        # Stage 0 sends activations and receives gradients; stage 1 the
        # other way round.
        for direction in ("sent", "received"):
            b = value(w, "trainyard_worker_payload_bytes_total", stage=stage,
                      direction=direction)
            assert b is not None and b > 0, (stage, direction, b)
assert steps_by_stage == {"0": STEPS, "1": STEPS}, steps_by_stage
print(f"PASS: controller and worker /metrics parse; {STEPS} steps per stage, "
      f"submit latency {value(after, 'trainyard_submit_seconds_sum') * 1000:.1f} ms")
