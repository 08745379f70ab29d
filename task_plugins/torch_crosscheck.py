"""Cross-checks the task plugins against PyTorch through the raw C ABI.

Loads each plugin .so with ctypes (an independent reading of task_abi.h:
the struct layouts here are written from the header, and struct_size is
compared), runs create / build_forward_inputs / compute_loss on random
inputs and compares loss and dLoss/dOutput with torch.nn.functional in
float64 and autograd, and cross_entropy's infer_outputs with torch.softmax
and torch.argmax.

Usage: torch_crosscheck.py <libmse.so> <libcross_entropy.so>
                           <liblogit_distillation.so>
Exits 0 with a SKIP line when torch is not importable.
"""

import ctypes as C
import json
import os
import struct
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"SKIP: torch not importable ({e}); torch cross-check not run")
    sys.exit(0)

MAX_DIMS = 8
FLOAT32, INT32, INT64 = 0, 2, 3
TORCH_DTYPE = {FLOAT32: torch.float32, INT32: torch.int32, INT64: torch.int64}


class Tensor(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", C.c_int32),
                ("ndim", C.c_int32), ("shape", C.c_int64 * MAX_DIMS),
                ("data", C.c_void_p)]


class Error(C.Structure):
    _fields_ = [("message", C.c_char * 1024)]


ADD_TENSOR = C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_char_p, C.c_int32,
                         C.c_int32, C.POINTER(C.c_int64))
ADD_METRIC = C.CFUNCTYPE(None, C.c_void_p, C.c_char_p, C.c_double)
ADD_BYTES = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_size_t)


class Sink(C.Structure):
    _fields_ = [("ctx", C.c_void_p), ("add_tensor", ADD_TENSOR),
                ("add_metric", ADD_METRIC), ("add_bytes", ADD_BYTES)]


class Batch(C.Structure):
    _fields_ = [("tensors", C.POINTER(Tensor)), ("num_tensors", C.c_int32),
                ("step", C.c_int64), ("is_eval", C.c_int32)]


class LossArgs(C.Structure):
    _fields_ = [("output", C.POINTER(Tensor)), ("state", C.POINTER(Tensor)),
                ("num_state", C.c_int32), ("grad_output", C.POINTER(Tensor)),
                ("step", C.c_int64), ("microbatch", C.c_int32),
                ("num_microbatches", C.c_int32), ("is_eval", C.c_int32)]


class InferArgs(C.Structure):
    _fields_ = [("output", C.POINTER(Tensor)), ("state", C.POINTER(Tensor)),
                ("num_state", C.c_int32), ("row_offset", C.c_int64),
                ("output_dir", C.c_char_p), ("microbatch", C.c_int32),
                ("num_microbatches", C.c_int32)]


class LossResult(C.Structure):
    _fields_ = [("loss", C.c_double), ("loss_weight", C.c_double)]


P = C.c_void_p
TaskV1Fields = [
    ("abi_version", C.c_uint32), ("struct_size", C.c_uint32),
    ("name", C.c_char_p),
    ("create", C.CFUNCTYPE(P, C.c_char_p, C.POINTER(Error))),
    ("build_forward_inputs",
     C.CFUNCTYPE(C.c_int, P, C.POINTER(Batch), C.POINTER(Sink),
                 C.POINTER(Error))),
    ("compute_loss",
     C.CFUNCTYPE(C.c_int, P, C.POINTER(LossArgs), C.POINTER(LossResult),
                 C.POINTER(Sink), C.POINTER(Error))),
    ("update_metrics",
     C.CFUNCTYPE(C.c_int, P, C.c_int32, C.POINTER(Sink), C.POINTER(Error))),
    ("state_dict", P), ("load_state_dict", P), ("on_event", P),
    ("process_outputs", P), ("finalize", P),
    ("destroy", C.CFUNCTYPE(None, P)),
    # Appended to v1; a table of the first layout ends above.
    ("validate_config", C.CFUNCTYPE(C.c_int, C.c_char_p, C.POINTER(Error))),
    ("create_confined",
     C.CFUNCTYPE(P, C.c_char_p, C.c_char_p, C.POINTER(Error))),
    ("infer_outputs",
     C.CFUNCTYPE(C.c_int, P, C.POINTER(InferArgs), C.POINTER(Sink),
                 C.POINTER(Error))),
]


class TaskV1(C.Structure):
    _fields_ = TaskV1Fields


def abi_tensor(name, t):
    t = t.contiguous()
    a = Tensor()
    a.name = name.encode()
    a.dtype = {v: k for k, v in TORCH_DTYPE.items()}[t.dtype]
    a.ndim = t.dim()
    for i, d in enumerate(t.shape):
        a.shape[i] = d
    a.data = t.data_ptr()
    return a, t  # keep t alive


class PySink:
    def __init__(self):
        self.tensors = {}
        self.metrics = {}
        self._keep = []
        self.sink = Sink(None, ADD_TENSOR(self._add_tensor),
                         ADD_METRIC(self._add_metric),
                         ADD_BYTES(lambda ctx, d, n: None))

    def _add_tensor(self, ctx, name, dtype, ndim, shape):
        t = torch.zeros([shape[i] for i in range(ndim)],
                        dtype=TORCH_DTYPE[dtype])
        self.tensors[name.decode()] = t
        return t.data_ptr()

    def _add_metric(self, ctx, name, value):
        self.metrics[name.decode()] = value


class Plugin:
    def __init__(self, path):
        self.lib = C.CDLL(os.path.abspath(path))
        entry = self.lib.trainyard_task_v1
        entry.restype = C.POINTER(TaskV1)
        self.t = entry().contents
        assert self.t.abi_version == 1, self.t.abi_version
        assert self.t.struct_size == C.sizeof(TaskV1), (
            f"{path}: struct_size {self.t.struct_size} != ctypes layout "
            f"{C.sizeof(TaskV1)}")

    def create(self, config):
        err = Error()
        h = self.t.create(json.dumps(config).encode(), C.byref(err))
        assert h, err.message.decode()
        return h

    def create_confined(self, config, data_dir):
        """The handle, or the error message when the plugin refuses."""
        err = Error()
        h = self.t.create_confined(json.dumps(config).encode(),
                                   data_dir.encode(), C.byref(err))
        return h if h else err.message.decode()

    def validate(self, config):
        """"" when validate_config accepts the config, else its message."""
        err = Error()
        rc = self.t.validate_config(json.dumps(config).encode(), C.byref(err))
        return "" if rc == 0 else err.message.decode()

    def build(self, h, batch):
        keep, arr = [], (Tensor * len(batch))()
        for i, (name, t) in enumerate(batch.items()):
            arr[i], k = abi_tensor(name, t)
            keep.append(k)
        b = Batch(arr, len(batch), 0, 0)
        sink, err = PySink(), Error()
        rc = self.t.build_forward_inputs(h, C.byref(b), C.byref(sink.sink),
                                         C.byref(err))
        assert rc == 0, err.message.decode()
        return sink.tensors

    def loss(self, h, output, state):
        output = output.float().contiguous()
        out_abi, _ = abi_tensor("output", output)
        grad = torch.zeros_like(output)
        grad_abi, _ = abi_tensor("grad_output", grad)
        keep, arr = [], (Tensor * max(1, len(state)))()
        for i, (name, t) in enumerate(state.items()):
            arr[i], k = abi_tensor(name, t)
            keep.append(k)
        args = LossArgs(C.pointer(out_abi), arr, len(state),
                        C.pointer(grad_abi), 0, 0, 1, 0)
        res, sink, err = LossResult(), PySink(), Error()
        rc = self.t.compute_loss(h, C.byref(args), C.byref(res),
                                 C.byref(sink.sink), C.byref(err))
        assert rc == 0, err.message.decode()
        return res.loss, res.loss_weight, grad

    def infer(self, h, output, row_offset, output_dir):
        """The tensors infer_outputs adds for one microbatch, by name."""
        output = output.float().contiguous()
        out_abi, _ = abi_tensor("output", output)
        args = InferArgs(C.pointer(out_abi), None, 0, row_offset,
                         output_dir.encode(), 0, 1)
        sink, err = PySink(), Error()
        rc = self.t.infer_outputs(h, C.byref(args), C.byref(sink.sink),
                                  C.byref(err))
        assert rc == 0, err.message.decode()
        return sink.tensors


failures = []


def check(what, got_loss, got_grad, ref_loss, ref_grad):
    dl = abs(got_loss - ref_loss) / max(abs(ref_loss), 1e-30)
    dg = ((got_grad.double() - ref_grad).abs() /
          (ref_grad.abs() + 1e-7)).max().item()
    ok = dl < 1e-9 and dg < 1e-5
    print(f"{'ok' if ok else 'FAIL'}: {what}: loss {got_loss:.12g} vs torch "
          f"{ref_loss:.12g} (rel {dl:.1e}), max grad rel err {dg:.1e}")
    if not ok:
        failures.append(what)


def torch_ref(fn, output):
    x = output.double().clone().requires_grad_(True)
    loss = fn(x)
    loss.backward()
    return loss.item(), x.grad


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = t.float().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def expect(what, ok):
    print(f"{'ok' if ok else 'FAIL'}: {what}")
    if not ok:
        failures.append(what)


def main():
    mse_so, xent_so, distill_so = sys.argv[1:4]
    g = torch.Generator().manual_seed(0)

    mse = Plugin(mse_so)
    expect("mse validate_config accepts {}", mse.validate({}) == "")
    expect("mse validate_config refuses reduction=sum",
           mse.validate({"reduction": "sum"}).startswith(
               "task.config.reduction: "))
    h = mse.create({})
    out = torch.randn(9, 5, generator=g)
    tgt = torch.randn(9, 5, generator=g)
    loss, _, grad = mse.loss(h, out, {"targets": tgt})
    check("mse", loss, grad,
          *torch_ref(lambda x: F.mse_loss(x, tgt.double()), out))
    mse.t.destroy(h)

    xent = Plugin(xent_so)
    labels = torch.tensor([0, 3, -100, 5, 1, 1, -100, 2, 4])
    for eps in (0.0, 0.1, 0.45):
        h = xent.create({"label_smoothing": eps})
        out = torch.randn(9, 6, generator=g) * 3
        loss, w, grad = xent.loss(h, out, {"labels": labels})
        assert w == 7, w
        check(f"cross_entropy label_smoothing={eps}", loss, grad,
              *torch_ref(lambda x: F.cross_entropy(
                  x, labels, ignore_index=-100, label_smoothing=eps), out))
        xent.t.destroy(h)

    # Inference: softmax probabilities and the argmax, with a tie.
    h = xent.create({})
    out = torch.randn(9, 6, generator=g) * 4
    out[4, 1] = out[4, 3] = out[4].max() + 1
    with tempfile.TemporaryDirectory() as d:
        got = xent.infer(h, out, 20, d)
    perr = (got["probabilities"].double() -
            torch.softmax(out.double(), dim=1)).abs().max().item()
    expect(f"cross_entropy probabilities vs torch.softmax (max abs err "
           f"{perr:.1e})", perr < 1e-7)
    expect("cross_entropy predicted_class vs torch.argmax (first maximum)",
           torch.equal(got["predicted_class"], out.argmax(dim=1)) and
           got["predicted_class"][4].item() == 1)
    xent.t.destroy(h)

    # Distillation: teacher forward (gelu, relu) and the combined loss.
    distill = Plugin(distill_so)
    w = {"blocks.0.fc1.weight": torch.randn(8, 6, generator=g) * 0.5,
         "blocks.0.fc1.bias": torch.randn(8, generator=g) * 0.1,
         "blocks.0.fc2.weight": torch.randn(7, 8, generator=g) * 0.5,
         "blocks.0.fc2.bias": torch.randn(7, generator=g) * 0.1,
         "blocks.1.fc1.weight": torch.randn(5, 7, generator=g) * 0.5,
         "blocks.1.fc2.weight": torch.randn(4, 5, generator=g) * 0.8}
    t_, alpha = 2.5, 0.3
    config = {"teacher": "t.safetensors",
              "teacher_blocks": [{"activation": "gelu"},
                                 {"activation": "relu"}],
              "temperature": t_, "alpha": alpha}
    expect("logit_distillation validate_config opens no file",
           distill.validate(dict(config, teacher="/nonexistent/t")) == "")
    with tempfile.TemporaryDirectory() as d:
        write_safetensors(os.path.join(d, "t.safetensors"), w)
        data = os.path.join(d, "data")
        os.mkdir(data)
        refused = distill.create_confined(
            dict(config, teacher="../t.safetensors"), data)
        expect("create_confined refuses a teacher outside the data folder",
               isinstance(refused, str) and
               refused.startswith("task.config.teacher: ") and
               "outside the data folder" in refused)
        h = distill.create_confined(config, d)
        assert not isinstance(h, str), h
    feats = torch.randn(9, 6, generator=g)
    targets = torch.tensor([0, 3, -100, 1, 2, 2, -100, 0, 1])
    st = distill.build(h, {"features": feats, "targets": targets})
    x = feats.double()
    x = F.linear(F.gelu(F.linear(x, w["blocks.0.fc1.weight"].double(),
                                 w["blocks.0.fc1.bias"].double())),
                 w["blocks.0.fc2.weight"].double(),
                 w["blocks.0.fc2.bias"].double())
    x = F.linear(F.relu(F.linear(x, w["blocks.1.fc1.weight"].double())),
                 w["blocks.1.fc2.weight"].double())
    terr = (st["teacher_logits"].double() - x).abs().max().item()
    ok = terr < 1e-5
    print(f"{'ok' if ok else 'FAIL'}: teacher forward max abs err {terr:.1e}")
    if not ok:
        failures.append("teacher forward")
    teacher = st["teacher_logits"]
    out = torch.randn(9, 4, generator=g) * 2
    loss, wt, grad = distill.loss(h, out, {"teacher_logits": teacher,
                                           "labels": st["labels"]})
    keep = targets != -100
    assert wt == keep.sum().item(), wt

    def distill_ref(x):
        xs, ts, ys = x[keep], teacher.double()[keep], targets[keep]
        kl = F.kl_div(F.log_softmax(xs / t_, dim=1), F.softmax(ts / t_, dim=1),
                      reduction="batchmean")
        return alpha * t_ * t_ * kl + (1 - alpha) * F.cross_entropy(xs, ys)

    check("logit_distillation", loss, grad, *torch_ref(distill_ref, out))
    distill.t.destroy(h)

    if failures:
        print("FAILED:", ", ".join(failures))
        sys.exit(1)
    print(f"all checks passed (torch {torch.__version__})")


if __name__ == "__main__":
    main()
