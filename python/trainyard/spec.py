"""Turns what submit() is given (a spec file, a dict, a JobSpec) into the
JobSpec it sends, as `trainyard submit` does (cli/job_client.cc):
relative paths resolve against the spec file's folder, and block 0's
in_features is read from a local .npy features file when the spec leaves it
unset.
"""
import ast
import os
import struct

from google.protobuf import json_format
from google.protobuf.message import Message

from ._proto import job_spec_pb2
from .errors import InvalidArgument

JobSpec = job_spec_pb2.JobSpec


def load_spec(spec, base_dir=None):
    """A new JobSpec from a path (str or os.PathLike) to a proto3 JSON file,
    a dict in proto3 JSON form, or a JobSpec message (copied, never changed).

    Relative paths (data files, init weights, checkpoint folder) resolve
    against base_dir: by default the spec file's folder, and for a dict or a
    message none (the workers resolve them against their --data_dir).
    Raises InvalidArgument for a file that cannot be read or does not parse
    (unknown fields included), naming the file.
    """
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise InvalidArgument(f"spec {path}: cannot read it: {e.strerror}") from None
        out = JobSpec()
        try:
            json_format.Parse(text, out)
        except json_format.ParseError as e:
            raise InvalidArgument(f"spec {path}: {e}") from None
        if base_dir is None:
            base_dir = os.path.dirname(os.path.abspath(path))
    elif isinstance(spec, dict):
        out = JobSpec()
        try:
            json_format.ParseDict(spec, out)
        except json_format.ParseError as e:
            raise InvalidArgument(f"spec: {e}") from None
    elif isinstance(spec, Message) and spec.DESCRIPTOR.full_name == JobSpec.DESCRIPTOR.full_name:
        # Also a JobSpec from other generated code (e.g. the Bazel-built
        # proto/job_spec_pb2): the same message, another Python class.
        out = JobSpec.FromString(spec.SerializeToString())
    else:
        raise TypeError(f"spec must be a path, a dict or a JobSpec, not {type(spec).__name__}")
    if base_dir is not None:
        resolve_paths(out, os.path.abspath(base_dir))
    fill_input_width(out)
    return out


def resolve_paths(spec, base_dir):
    """Makes the spec's relative paths absolute under base_dir (in place)."""
    def absolute(msg, field):
        path = getattr(msg, field)
        if path and not os.path.isabs(path):
            setattr(msg, field, os.path.join(base_dir, path))

    for name in ("train", "eval"):
        if not spec.data.HasField(name):
            continue
        source = getattr(spec.data, name)
        if source.HasField("npy"):
            absolute(source.npy, "features")
            absolute(source.npy, "targets")
        if source.HasField("npy_shards"):
            for entries in (source.npy_shards.features, source.npy_shards.targets):
                for i, path in enumerate(entries):
                    if path and not os.path.isabs(path):
                        entries[i] = os.path.join(base_dir, path)
    if spec.model.HasField("init"):
        absolute(spec.model.init, "safetensors")
    if spec.HasField("checkpoint"):
        absolute(spec.checkpoint, "dir")
    if spec.HasField("inference"):
        absolute(spec.inference, "checkpoint_dir")
        absolute(spec.inference, "output_dir")


def fill_input_width(spec):
    """Sets model.blocks[0].in_features from the train features file when it
    is unset and the file is local (the controller does not read data files
    and cannot infer it). A file it cannot read is left for the workers to
    report."""
    if not spec.model.blocks or spec.model.blocks[0].in_features:
        return
    if not spec.data.train.HasField("npy"):
        return
    path = spec.data.train.npy.features
    if not os.path.isabs(path):
        return
    shape = npy_shape(path)
    if shape is not None and len(shape) == 2:
        spec.model.blocks[0].in_features = shape[1]


def npy_shape(path):
    """The shape in a .npy file's header (numpy's format, versions 1-3), or
    None when the file cannot be read as one."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 10 or head[:6] != b"\x93NUMPY":
                return None
            if head[6] == 1:
                size, start = struct.unpack("<H", head[8:10])[0], 10
            else:
                size, start = struct.unpack("<I", head[8:12])[0], 12
            if size > 1 << 16:
                return None
            f.seek(start)
            header = ast.literal_eval(f.read(size).decode("latin1"))
        shape = header["shape"]
        return tuple(int(d) for d in shape)
    except (OSError, ValueError, SyntaxError, KeyError, TypeError, struct.error):
        return None

