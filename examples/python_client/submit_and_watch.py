#!/usr/bin/python3
"""Submits a Trainyard job and watches it to the end, with the trainyard package.

Install the package first (python/README.md), e.g. into a venv that uses
Debian's python3-grpcio and python3-protobuf:

    /usr/bin/python3 -m venv --system-site-packages ~/.venvs/trainyard
    ~/.venvs/trainyard/bin/pip install --no-build-isolation ./python
    ~/.venvs/trainyard/bin/python examples/python_client/submit_and_watch.py \\
        --controller 127.0.0.1:7070 --insecure --spec examples/digits.json

(or, from a checkout without installing: PYTHONPATH=python /usr/bin/python3 ...).
Relative paths in the spec resolve against the spec file's folder, as with
`trainyard submit`. TLS is the default: --tls_ca names the controller's CA
(default $TRAINYARD_CA, else the system's roots), --insecure is plaintext;
--token defaults to $TRAINYARD_TOKEN or the file named by
$TRAINYARD_TOKEN_FILE. Prints one line per step and eval; exits 0 when the
job SUCCEEDED, 1 when it did not, 2 for a bad spec or job, 3 when the
controller could not be reached.
"""
import argparse
import sys

import trainyard


def print_event(ev):
    if isinstance(ev, trainyard.StepEvent):
        extra = " ".join(f"{k}={v:.4f}" for k, v in sorted(ev.metrics.items()) if k != "loss")
        print(f"step {ev.step} loss={ev.loss:.6f} lr={ev.lr:.6g} {extra}".rstrip(), flush=True)
    elif isinstance(ev, trainyard.EvalEvent):
        extra = " ".join(f"eval_{k}={v:.4f}" for k, v in sorted(ev.metrics.items())
                         if k != "loss")
        print(f"eval after step {ev.step}: loss={ev.loss:.6f} {extra}".rstrip(), flush=True)
    elif isinstance(ev, trainyard.NoteEvent):
        print(f"note: {ev.text}", flush=True)
    elif isinstance(ev, trainyard.RecoveryEvent):
        print(f"restart {ev.attempt}: resumed after step {ev.resume_step}; cause: {ev.cause}",
              flush=True)
    elif isinstance(ev, trainyard.StateEvent):
        print(f"state {ev.state.name} {ev.reason}".rstrip(), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controller", default=None,
                        help="host:port (default $TRAINYARD_CONTROLLER, else 127.0.0.1:7070)")
    parser.add_argument("--spec", required=True, help="a proto3 JSON job spec file")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds to wait for the job to end")
    parser.add_argument("--token", default=None,
                        help="bearer token (default $TRAINYARD_TOKEN or $TRAINYARD_TOKEN_FILE)")
    tls = parser.add_mutually_exclusive_group()
    tls.add_argument("--tls_ca", default=None,
                     help="CA PEM file to verify the controller with (default $TRAINYARD_CA, "
                          "else the system's roots)")
    tls.add_argument("--insecure", action="store_true", help="plaintext, no TLS")
    parser.add_argument("--stubs", default=None,
                        help="ignored: the stubs ship in the trainyard package")
    args = parser.parse_args()

    try:
        client = trainyard.Client(args.controller, token=args.token,
                                  tls=False if args.insecure else args.tls_ca)
        with client:
            job = client.submit(args.spec)
            print(f"submitted {job.job_id}: {trainyard.JobState(job.state).name}", flush=True)
            final = None
            for ev in client.watch(job.job_id, timeout=args.timeout):
                print_event(ev)
                if isinstance(ev, trainyard.StateEvent):
                    final = ev.state
    except (trainyard.InvalidArgument, trainyard.NotFound) as e:
        print(f"submit_and_watch: {e}", file=sys.stderr)
        return 2
    except trainyard.Unavailable as e:
        print(f"submit_and_watch: {e}", file=sys.stderr)
        return 3
    except trainyard.Error as e:
        print(f"submit_and_watch: {e}", file=sys.stderr)
        return 1
    return 0 if final == trainyard.JobState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
