"""cc_proto: C++ (and optionally gRPC) code from .proto files with the system
protoc, so nothing is fetched. Imports resolve against the workspace root and
/usr/include (the well-known types)."""

def cc_proto(name, srcs, deps = [], grpc = False, visibility = None):
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    cmd = "/usr/bin/protoc -I. -I/usr/include --cpp_out=$(GENDIR)"
    if grpc:
        cmd += " --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin --grpc_out=$(GENDIR)"
    cmd += " " + " ".join(["$(location %s)" % s for s in srcs])
    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = cmd,
    )
    native.filegroup(name = name + "_srcs", srcs = srcs + [d + "_srcs" for d in deps], visibility = visibility)
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:grpc" if grpc else "@system//:protobuf"],
        visibility = visibility,
    )
