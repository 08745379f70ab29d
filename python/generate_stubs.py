#!/usr/bin/python3
"""Regenerates the gRPC stubs in trainyard/_proto/ from proto/*.proto.

    /usr/bin/python3 python/generate_stubs.py           # after editing a .proto
    /usr/bin/python3 python/generate_stubs.py --check   # exit 1 if they are stale

The stubs are checked in so that `pip install ./python` needs neither protoc
nor the repository around python/; tests/python_client_test.py runs --check,
so they cannot go stale. Same compiler and plugin as the genrule in
proto/BUILD.bazel (Debian's protobuf-compiler and protobuf-compiler-grpc).
The one change to protoc's output: the generated `from proto import x_pb2`
becomes `from . import x_pb2`, so the package installs no top-level `proto`.
"""
import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ["proto/job_spec.proto", "proto/trainyard.proto"]
STUBS = ["job_spec_pb2.py", "trainyard_pb2.py", "trainyard_pb2_grpc.py"]
_PROTO_IMPORT = re.compile(r"^from proto import (\w+) as (\w+)$", re.M)


def generate(proto_root, protoc, plugin):
    """Returns {file name: text} of the stubs protoc writes for PROTOS."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [protoc, f"-I{proto_root}", "-I/usr/include", f"--python_out={out}",
               f"--plugin=protoc-gen-grpc_python={plugin}", f"--grpc_python_out={out}"]
        cmd += [os.path.join(proto_root, p) for p in PROTOS]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"generate_stubs: {' '.join(cmd)} failed:\n{run.stderr}")
        stubs = {}
        for name in STUBS:
            with open(os.path.join(out, "proto", name)) as f:
                text = _PROTO_IMPORT.sub(r"from . import \1 as \2", f.read())
            if "from proto " in text or "import proto" in text:
                sys.exit(f"generate_stubs: {name}: an import of `proto` is left")
            stubs[name] = text
        return stubs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the checked-in stubs instead of writing them")
    parser.add_argument("--proto_root", default=os.path.dirname(HERE),
                        help="the folder that holds proto/ (default: the repository)")
    parser.add_argument("--out", default=os.path.join(HERE, "trainyard", "_proto"))
    parser.add_argument("--protoc", default="/usr/bin/protoc")
    parser.add_argument("--grpc_python_plugin", default="/usr/bin/grpc_python_plugin")
    args = parser.parse_args()

    stubs = generate(args.proto_root, args.protoc, args.grpc_python_plugin)
    stale = []
    for name, text in stubs.items():
        path = os.path.join(args.out, name)
        try:
            with open(path) as f:
                old = f.read()
        except FileNotFoundError:
            old = ""
        if old == text:
            continue
        stale.append(name)
        if args.check:
            diff = difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                        f"checked in: {name}", f"from the .proto: {name}")
            sys.stdout.writelines(list(diff)[:40])
        else:
            with open(path, "w") as f:
                f.write(text)
    if args.check and stale:
        print(f"generate_stubs: stale in {args.out}: {', '.join(stale)}; "
              "run /usr/bin/python3 python/generate_stubs.py", file=sys.stderr)
        return 1
    print(f"generate_stubs: {len(stubs) - len(stale)} up to date, "
          f"{len(stale)} {'stale' if args.check else 'rewritten'} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
