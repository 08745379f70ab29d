#!/usr/bin/python3
"""Submits a Trainyard job and watches it to the end, over gRPC.

Uses stubs generated from the same .proto files as the C++ code:

    bazel build //proto:trainyard_py          # writes bazel-bin/proto/*_pb2*.py
    /usr/bin/python3 examples/python_client/submit_and_watch.py \\
        --controller 127.0.0.1:7070 --spec examples/digits.json

(Debian's /usr/bin/python3 with python3-grpcio and python3-protobuf.)
Relative paths in the spec resolve against the spec file's folder, as with
`trainyard submit`. Prints one line per step and eval; exits 0 when the job
SUCCEEDED, 1 otherwise.
"""
import argparse
import os
import sys
import uuid


def load_stubs(stubs_dir):
    sys.path.insert(0, stubs_dir)
    from proto import job_spec_pb2, trainyard_pb2, trainyard_pb2_grpc  # noqa
    return job_spec_pb2, trainyard_pb2, trainyard_pb2_grpc


def resolve(base, path):
    return path if not path or os.path.isabs(path) else os.path.join(base, path)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controller", default="127.0.0.1:7070")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--stubs", default=os.path.join(here, "..", "..", "bazel-bin"),
                        help="folder holding proto/trainyard_pb2.py")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds to wait for the job to end")
    args = parser.parse_args()

    import grpc
    from google.protobuf import json_format
    job_spec_pb2, pb, pb_grpc = load_stubs(args.stubs)

    spec = job_spec_pb2.JobSpec()
    with open(args.spec) as f:
        json_format.Parse(f.read(), spec)  # unknown fields are errors
    base = os.path.dirname(os.path.abspath(args.spec))
    for src in (spec.data.train, spec.data.eval):
        if src.HasField("npy"):
            src.npy.features = resolve(base, src.npy.features)
            src.npy.targets = resolve(base, src.npy.targets)
    if spec.checkpoint.dir:
        spec.checkpoint.dir = resolve(base, spec.checkpoint.dir)

    channel = grpc.insecure_channel(args.controller)
    jobs = pb_grpc.JobServiceStub(channel)
    job = jobs.SubmitJob(pb.SubmitJobRequest(request_id=str(uuid.uuid4()), spec=spec),
                         timeout=30, wait_for_ready=True)
    print(f"submitted {job.job_id}: {pb.JobState.Name(job.state)}", flush=True)

    final = None
    for event in jobs.WatchJob(pb.WatchJobRequest(job_id=job.job_id, from_step=0),
                               timeout=args.timeout):
        kind = event.WhichOneof("event")
        if kind == "step":
            s = event.step
            extra = " ".join(f"{k}={v:.4f}" for k, v in sorted(s.metrics.items()))
            print(f"step {s.step} loss={s.loss:.6f} lr={s.lr:.6g} {extra}", flush=True)
        elif kind == "eval":
            e = event.eval
            extra = " ".join(f"eval_{k}={v:.4f}" for k, v in sorted(e.metrics.items()))
            print(f"eval after step {e.step}: loss={e.loss:.6f} {extra}", flush=True)
        elif kind == "state":
            final = event.state
            print(f"state {pb.JobState.Name(final.state)} {final.reason}".rstrip(), flush=True)
            if final.state in (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED):
                break
    return 0 if final is not None and final.state == pb.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
