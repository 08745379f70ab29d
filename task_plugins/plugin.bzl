"""task_plugin(): a task plugin shared library lib<name>.so.

Links the plugin's sources with the plugin SDK into one .so whose only
exported dynamic symbols are its ABI entry points, trainyard_task_v1 and
(for a plugin with a device loss) trainyard_task_v2 (see exports.lds).
"""

def task_plugin(name, srcs, deps = [], testonly = 0, visibility = None):
    native.cc_binary(
        name = "lib%s.so" % name,
        srcs = srcs,
        linkshared = 1,
        testonly = testonly,
        visibility = visibility,
        additional_linker_inputs = ["//task_plugins:exports.lds"],
        linkopts = [
            "-Wl,--version-script=$(location //task_plugins:exports.lds)",
            "-Wl,--no-undefined",
        ],
        deps = deps + [
            "//task_plugins:plugin_sdk",
            "//task_plugins:task_abi",
        ],
    )
