"""Inference and evaluation jobs over examples/digits, from the checkpoint of
its 3-stage training run: `trainyard infer` writes predictions whose
accuracy is the training job's final eval accuracy, bitwise-identical files
for 1, 2 and 3 stages and 1 and 2 replicas; `trainyard eval` reproduces the
final eval bitwise; the same inference on 2 worker processes through the
controller (watched as progress in rows), and again with one of them
SIGKILLed mid-job: the job resumes from its complete shards, which are never
rewritten, and ends with every row once, bitwise as the local run."""
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np

import sys

from cluster import (CLI_BIN, PLUGIN_DIR, ROOT, TERMINAL, Cluster, pb,
                     spec_from_json, wait_for)

sys.path.insert(0, os.path.join(ROOT, "python"))
import trainyard  # noqa: E402  the Python client, from the checkout

WORK = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
EXAMPLES = os.path.join(ROOT, "examples")
CKPT = os.path.join(WORK, "ckpt")


def digits_spec():
    with open(os.path.join(EXAMPLES, "digits.json")) as f:
        spec = json.load(f)
    for source in ("train", "eval"):
        npy = spec["data"][source]["npy"]
        for key in ("features", "targets"):
            npy[key] = os.path.join(EXAMPLES, npy[key])
    return spec


def forward_spec(kind, stages=3, replicas=1, output=None, shard_rows=100):
    """The training spec made an infer or eval job of its eval rows."""
    spec = digits_spec()
    spec["kind"] = kind
    for key in ("steps", "optimizer"):
        spec.pop(key)
    spec["data"].pop("shuffle")
    spec["data"].pop("evalEvery")
    # The controller checks no file: it cannot infer the input width.
    spec["model"]["blocks"][0]["inFeatures"] = 64
    spec["parallelism"]["stages"] = stages
    spec["parallelism"]["replicas"] = replicas
    spec["inference"] = {"checkpointDir": CKPT}
    if output:
        spec["inference"].update(outputDir=output, shardRows=shard_rows)
    return spec


def run_cli(command, spec, tag, flags=()):
    """`trainyard <command>` on `spec` (a dict, or a spec file's path)."""
    path = spec
    if isinstance(spec, dict):
        path = os.path.join(WORK, f"{tag}.json")
        with open(path, "w") as f:
            json.dump(spec, f)
    out = os.path.join(WORK, f"{tag}.jsonl")
    run = subprocess.run([CLI_BIN, command, "--spec", path, "--metrics_out", out,
                          "--threads", "1", f"--plugin_dir={PLUGIN_DIR}", *flags],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in open(out)]


def shard_files(folder):
    """Every shard file's bytes by relative path."""
    files = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("shard-"):
            for f in sorted(os.listdir(os.path.join(folder, name))):
                with open(os.path.join(folder, name, f), "rb") as fh:
                    files[f"{name}/{f}"] = fh.read()
    return files


def read_outputs(folder):
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    assert manifest["complete"] is True, manifest
    out = {}
    for name in manifest["outputs"]:
        out[name] = np.concatenate([np.load(os.path.join(folder, s["files"][name]))
                                    for s in manifest["shards"]])
    return manifest, out


# 1. The README's quickstart: train digits (3 stages) with a checkpoint
#    after the last step, then write its predictions with digits_infer.json.
lines = run_cli("train", os.path.join(EXAMPLES, "digits.json"), "train",
                [f"--checkpoint_dir={CKPT}"])
final = [l for l in lines if "eval_loss" in l][-1]
assert final["step"] == 300, final
labels = np.load(os.path.join(EXAMPLES, "digits", "eval_labels.npy"))
print(f"trained: final eval loss {final['eval_loss']!r} accuracy "
      f"{final['eval_accuracy']!r}")
quick = os.path.join(WORK, "predictions")
run_cli("infer", os.path.join(EXAMPLES, "digits_infer.json"), "quickstart",
        [f"--checkpoint_dir={CKPT}", f"--output_dir={quick}"])

# 2. trainyard infer: bitwise the same files for every layout.
reference = None
for stages, replicas in [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (3, 2)]:
    out = os.path.join(WORK, f"pred-{stages}-{replicas}")
    shards = run_cli("infer", forward_spec("infer", stages, replicas, out),
                     f"infer-{stages}-{replicas}")
    assert sorted(s["shard"] for s in shards) == [0, 1, 2, 3], shards
    files = shard_files(out)
    assert len(files) == 8, sorted(files)  # 4 shards x 2 outputs
    if reference is None:
        reference = files
    assert files == reference, f"{stages} stages x {replicas} replicas differ"
manifest, pred = read_outputs(os.path.join(WORK, "pred-1-1"))
assert manifest["rows"] == 360 and manifest["model"]["step"] == 300, manifest
assert pred["probabilities"].shape == (360, 10), pred["probabilities"].shape
assert np.array_equal(pred["predicted_class"], pred["probabilities"].argmax(1))
accuracy = float(np.mean(pred["predicted_class"] == labels))
assert accuracy == final["eval_accuracy"], (accuracy, final["eval_accuracy"])
assert shard_files(quick) == reference, "the quickstart's predictions differ"
print(f"infer: 6 layouts bitwise equal; accuracy {accuracy!r} = the final eval's")

# 3. trainyard eval: the training job's final eval, bitwise.
for stages in (1, 3):
    (ev,) = run_cli("eval", forward_spec("eval", stages), f"eval-{stages}")
    assert ev["step"] == 300, ev
    for key in ("eval_loss", "eval_accuracy", "eval_samples"):
        assert ev[key] == final[key], (stages, key, ev[key], final[key])
print("eval: the final eval's loss and accuracy, bitwise (1 and 3 stages)")

# 4. The service: 2 worker processes, then one SIGKILLed mid-job.
cluster = Cluster(workers=3)
try:
    out = os.path.join(WORK, "svc")
    # Through the Python client: submitted, watched, its outputs read.
    client = trainyard.Client(cluster.address, tls=False)
    job = client.submit(forward_spec("infer", 2, 1, out))
    progress = [e for e in client.watch(job.job_id, timeout=180)
                if isinstance(e, trainyard.ProgressEvent)]
    done = cluster.get(job.job_id)
    assert done.state == pb.SUCCEEDED, (done.reason, cluster.log("controller"))
    assert progress and progress[-1].rows_done == 360, progress
    assert [p.rows_done for p in progress] == sorted({p.rows_done for p in progress})
    assert done.progress.rows_done == 360 and done.progress.shards_done == 4
    assert shard_files(out) == reference, "service outputs differ"
    got = trainyard.read_outputs(out)
    assert np.array_equal(got["predicted_class"], pred["predicted_class"])
    job = cluster.submit(spec_from_json(forward_spec("eval", 2)))
    events = cluster.watch(job.job_id, timeout=180)
    evals = [e.eval for e in events if e.WhichOneof("event") == "eval"]
    assert len(evals) == 1 and evals[0].step == 300, evals
    assert evals[0].loss == final["eval_loss"], (evals[0].loss, final)
    assert evals[0].metrics["accuracy"] == final["eval_accuracy"]
    print("service: infer bitwise as local, eval the final eval bitwise")

    # A long job: the eval rows 150 times (54,000 rows), one row per batch,
    # 60 shards.
    big = os.path.join(WORK, "big")
    os.makedirs(big)
    feats = np.load(os.path.join(EXAMPLES, "digits", "eval_features.npy"))
    np.save(os.path.join(big, "x.npy"), np.tile(feats, (150, 1)))
    np.save(os.path.join(big, "y.npy"), np.tile(labels, 150))

    def big_spec(output):
        spec = forward_spec("infer", 2, 1, output, shard_rows=900)
        spec["data"]["eval"] = {"npy": {"features": os.path.join(big, "x.npy"),
                                        "targets": os.path.join(big, "y.npy")}}
        spec["data"]["batchSize"] = 1
        spec["parallelism"]["microbatches"] = 1
        spec["recovery"] = {"maxRestarts": 2, "backoffMs": 100}
        return spec

    local = os.path.join(WORK, "big-local")
    run_cli("infer", big_spec(local), "big-local")
    out = os.path.join(WORK, "big-svc")
    job = cluster.submit(spec_from_json(big_spec(out)))
    watched = []
    watcher = threading.Thread(
        target=lambda: watched.extend(cluster.watch(job.job_id, timeout=600)),
        daemon=True)
    watcher.start()
    wait_for(lambda: cluster.get(job.job_id).progress.shards_done >= 5, 300,
             "5 shards written")
    names = {w.worker_id: w.name for w in cluster.jobs.ListWorkers(
        pb.ListWorkersRequest(), timeout=10).workers}
    victim = names[cluster.get(job.job_id).workers[1]]
    before = {n: os.stat(os.path.join(out, n)).st_ino
              for n in os.listdir(out) if n.startswith("shard-")}
    cluster.kill_worker(victim)
    final_job = cluster.wait_state(job.job_id, TERMINAL, 600)
    watcher.join(60)
    assert final_job.state == pb.SUCCEEDED, (final_job.reason,
                                             cluster.log("controller"))
    assert final_job.restarts == 1, list(final_job.restart_reasons)
    assert 5 <= len(before) < 60, len(before)
    for name, ino in before.items():
        assert os.stat(os.path.join(out, name)).st_ino == ino, f"{name} rewritten"
    assert shard_files(out) == shard_files(local), "outputs after the kill differ"
    _, got = read_outputs(out)
    assert got["predicted_class"].shape == (54000,)
    rows = [e.progress.rows_done for e in watched
            if e.WhichOneof("event") == "progress"]
    assert rows == sorted(rows) and rows[-1] == 54000, rows[-5:]
    print(f"killed {victim} after {len(before)} of 60 shards: restarted once, "
          f"those shards kept, all 54000 rows bitwise as the local run")

    # Cancelled mid-job: it stops within its batch, listed as CANCELLED.
    out = os.path.join(WORK, "big-cancelled")
    job = cluster.submit(spec_from_json(big_spec(out)))
    wait_for(lambda: cluster.get(job.job_id).progress.shards_done >= 2, 300,
             "2 shards written")
    cancelled_at = time.monotonic()
    cluster.jobs.CancelJob(pb.CancelJobRequest(job_id=job.job_id), timeout=10)
    ended = cluster.wait_state(job.job_id, TERMINAL, 60)
    assert ended.state == pb.CANCELLED, (ended.state, ended.reason)
    wait_for(lambda: all(not w.job_id for w in cluster.jobs.ListWorkers(
        pb.ListWorkersRequest(), timeout=10).workers), 30, "workers freed")
    stopped = time.monotonic() - cancelled_at
    done = sum(1 for n in os.listdir(out) if n.startswith("shard-"))
    assert done < 60, done
    listed = subprocess.run([CLI_BIN, "list", f"--controller={cluster.address}",
                             "--insecure"], capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    line = next(l for l in listed.stdout.splitlines() if job.job_id in l)
    assert "CANCELLED" in line and "rows " in line, line
    print(f"cancelled after {done} of 60 shards; its workers free {stopped:.2f} s "
          f"later; trainyard list: {line.split()[3]} {line.split()[4]}")
finally:
    cluster.stop()
print("PASS")
