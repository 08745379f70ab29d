#!/usr/bin/python3
"""Service benchmarks, against real processes on 127.0.0.1:

1. SubmitJob latency (p50/p99) with 1,000 jobs already queued.
2. Metrics fan-out: 100 concurrent WatchJob watchers on a job running at the
   fastest step rate the engine reaches (a tiny 1-stage model), counting
   lost, duplicated and out-of-order updates per watcher.
3. (--security) The cost of TLS and token authentication on 1.: plaintext
   and secure clusters measured alternately, side by side, plus the time
   to the first answer on a new channel (TCP, and the TLS handshake).
4. (--replay) Replaying a long job's history: a 20,000-step job runs to
   its end, then 10 watchers replay it from step 1 at once; a controller
   holding the default 4,096 events in memory (the rest read from
   controller.db) and one holding all of them, alternately, side by side,
   with each controller's resident memory after the job.

Build, then run from anywhere:
    bazel build //controller:trainyard-controller //worker:trainyard-worker \\
        //cli:trainyard //proto:trainyard_py //task_plugins:plugins
    /usr/bin/python3 tools/bench_service.py [--security | --replay] [--rounds N]
"""
import os
import statistics
import sys
import threading
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
os.chdir(os.path.join(REPO, "bazel-bin"))  # the harness finds binaries here
from cluster import Cluster, pb, pb_grpc, small_spec, spec_from_json, steps_of  # noqa: E402


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def submit_latencies(cluster, queued, measured):
    """SubmitJob latencies (ms) over the cluster's channel once `queued`
    jobs wait, and the time (ms) to the first ListJobs answer on each of 20
    new channels (connection setup included)."""
    spec = spec_from_json(small_spec(stages=1, steps=10))
    for _ in range(queued):
        cluster.submit(spec)
    lat = []
    for _ in range(measured):
        t0 = time.perf_counter()
        cluster.submit(spec, request_id=str(uuid.uuid4()))
        lat.append((time.perf_counter() - t0) * 1e3)
    first = []
    token = cluster.admin_token if cluster.secure else None
    for _ in range(20):
        t0 = time.perf_counter()
        channel = cluster.make_channel(token)
        pb_grpc.JobServiceStub(channel).ListJobs(
            pb.ListJobsRequest(page_size=1), timeout=30, wait_for_ready=True)
        first.append((time.perf_counter() - t0) * 1e3)
        channel.close()
    return lat, first


def bench_security(rounds=2, queued=1000, measured=500):
    results = {False: ([], []), True: ([], [])}
    for r in range(rounds):
        for secure in (False, True):
            cluster = Cluster(workers=0, secure=secure)
            lat, first = submit_latencies(cluster, queued, measured)
            cluster.stop()
            results[secure][0].extend(lat)
            results[secure][1].extend(first)
            print(f"round {r + 1} {'TLS+token' if secure else 'plaintext'}: "
                  f"p50 {percentile(lat, 0.5):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms",
                  flush=True)
    for secure in (False, True):
        lat, first = results[secure]
        print(f"SubmitJob, {queued} queued, {'TLS + token' if secure else 'plaintext  '}: "
              f"{len(lat)} submits, p50 {percentile(lat, 0.5):.2f} ms, "
              f"p99 {percentile(lat, 0.99):.2f} ms, mean {statistics.mean(lat):.2f} ms; "
              f"new channel to first answer p50 {percentile(first, 0.5):.2f} ms")
    ratio = lambda q: (percentile(results[True][0], q) /  # noqa: E731
                       percentile(results[False][0], q))
    print(f"TLS + token / plaintext: p50 x{ratio(0.5):.2f}, p99 x{ratio(0.99):.2f}")


def bench_submit(queued=1000, measured=500):
    cluster = Cluster(workers=0)
    lat, _ = submit_latencies(cluster, queued, measured)
    listed = cluster.jobs.ListJobs(pb.ListJobsRequest(states=[pb.QUEUED], page_size=1000),
                                   timeout=30)
    cluster.stop()
    print(f"SubmitJob with {queued} queued jobs: {measured} submits, "
          f"p50 {percentile(lat, 0.5):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms, "
          f"max {max(lat):.2f} ms, mean {statistics.mean(lat):.2f} ms "
          f"(ListJobs QUEUED page: {len(listed.jobs)} jobs)")


def fanout_spec(steps):
    spec = small_spec(stages=1, steps=steps, name="fanout", samples=256,
                      features=8, batch=16, microbatches=1)
    spec["data"]["evalEvery"] = 0
    spec["data"].pop("evalFraction")
    return spec_from_json(spec)


def job_seconds(cluster, job_id):
    job = cluster.get(job_id)
    return (job.end_time_ms - job.start_time_ms) / 1e3


def watch_all(cluster, job_id, watchers):
    """`watchers` WatchJob streams of the job from its start, begun at once;
    returns each one's steps and the seconds until the last ended."""
    results = [None] * watchers
    started = threading.Barrier(watchers + 1)

    def watch(i):
        started.wait()
        results[i] = [s.step for s in steps_of(cluster.watch(job_id, timeout=600))]

    threads = [threading.Thread(target=watch, args=(i,)) for i in range(watchers)]
    for t in threads:
        t.start()
    t0 = time.time()
    started.wait()
    for t in threads:
        t.join()
    return results, time.time() - t0


def bench_fanout(watchers=100, steps=2000):
    cluster = Cluster(workers=1)
    # Baseline: the same job with nobody watching.
    alone = cluster.submit(fanout_spec(steps))
    cluster.wait_state(alone.job_id, (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED), 600)
    alone_s = job_seconds(cluster, alone.job_id)
    print(f"fan-out baseline: {steps} steps with no watcher ran in {alone_s:.1f} s "
          f"({steps / alone_s:.0f} steps/s through worker -> controller)")
    job = cluster.submit(fanout_spec(steps))
    results, wall = watch_all(cluster, job.job_id, watchers)
    final = cluster.get(job.job_id)
    watched_s = job_seconds(cluster, job.job_id)
    expected = list(range(1, steps + 1))
    lost = sum(len(set(expected) - set(r)) for r in results)
    dup = sum(len(r) - len(set(r)) for r in results)
    disorder = sum(1 for r in results if r != sorted(r))
    cluster.stop()
    print(f"fan-out: {watchers} watchers x {steps} steps, job {pb.JobState.Name(final.state)} "
          f"ran in {watched_s:.1f} s ({steps / watched_s:.0f} steps/s), last watcher done "
          f"after {wall:.1f} s; "
          f"lost {lost}, duplicated {dup}, out-of-order watchers {disorder}")


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def bench_replay(rounds=3, steps=20000, watchers=10):
    times = {4096: [], 1000000: []}
    for r in range(rounds):
        for in_memory in times:
            cluster = Cluster(workers=1, controller_args=[
                f"--events_in_memory={in_memory}"])
            job = cluster.submit(fanout_spec(steps))
            cluster.wait_state(job.job_id, (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED), 600)
            rss = rss_mb(cluster.controller.pid)
            results, wall = watch_all(cluster, job.job_id, watchers)
            cluster.stop()
            expected = list(range(1, steps + 1))
            bad = sum(1 for res in results if res != expected)
            times[in_memory].append(wall)
            print(f"round {r + 1}, {in_memory} events in memory: {watchers} watchers "
                  f"replayed {steps} steps in {wall:.2f} s (watchers not seeing "
                  f"exactly steps 1..{steps}: {bad}); controller RSS after the "
                  f"job {rss:.0f} MB", flush=True)
    store, memory = statistics.median(times[4096]), statistics.median(times[1000000])
    print(f"replay medians: 4096 in memory (the rest from controller.db) {store:.2f} s, "
          f"all in memory {memory:.2f} s: x{store / memory:.2f}")


if __name__ == "__main__":
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else None
    if "--security" in sys.argv:
        bench_security(rounds=rounds or 2)
    elif "--replay" in sys.argv:
        bench_replay(rounds=rounds or 3)
    else:
        bench_submit()
        bench_fanout()
