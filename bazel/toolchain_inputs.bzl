"""r2ccl_toolchain_inputs: a local repository with what the build takes from this machine,
found, never downloaded: the Python headers, XLA's FFI headers (jax.ffi.include_dir()) and
nanobind's sources from the installed packages, and rdma-core's verbs header when present.
The Python is $R2CCL_PYTHON, else $PYTHON_BIN_PATH, else python3 on PATH. A missing input
fails the build with its name."""

_NANOBIND_SRCS = [
    "nb_internals.cpp",
    "nb_func.cpp",
    "nb_type.cpp",
    "nb_enum.cpp",
    "nb_ndarray.cpp",
    "nb_static_property.cpp",
    "nb_datetime.cpp",
    "common.cpp",
    "error.cpp",
    "trampoline.cpp",
    "implicit.cpp",
]

def _python(ctx):
    for var in ("R2CCL_PYTHON", "PYTHON_BIN_PATH"):
        v = ctx.os.environ.get(var, "")
        if v:
            return v
    p = ctx.which("python3")
    if not p:
        fail("jax_r2ccl: no Python found (set R2CCL_PYTHON to the interpreter that has jax and nanobind)")
    return str(p)

def _impl(ctx):
    python = _python(ctx)
    r = ctx.execute([python, ctx.path(Label("//bazel:inputs.py"))], quiet = True)
    if r.return_code != 0:
        fail("jax_r2ccl: %s could not report the build inputs:\n%s" % (python, r.stderr))
    found = {"missing": []}
    for line in r.stdout.splitlines():
        tab = line.find("\t")
        if tab < 0:
            continue
        key, value = line[:tab], line[tab + 1:]
        if key == "missing":
            found["missing"].append(value)
        else:
            found[key] = value
    if found["missing"]:
        fail("jax_r2ccl: missing build inputs (Python %s):\n  %s" % (python, "\n  ".join(found["missing"])))
    ctx.symlink(found["python_include"], "python_include")
    ctx.symlink(found["xla_include"], "xla_include")
    ctx.symlink(found["nanobind"], "nanobind")
    if found["ibverbs_include"]:
        ctx.symlink(found["ibverbs_include"] + "/infiniband", "ibverbs_include/infiniband")
    ctx.file("defs.bzl", "\n".join([
        "# Written by bazel/toolchain_inputs.bzl from %s." % found["python"],
        "EXT_SUFFIX = %r" % found["ext_suffix"],
        "HAVE_IBVERBS = %s" % ("True" if found["ibverbs_include"] else "False"),
        "PYTHON = %r" % found["python"],
        "",
    ]))
    ctx.file("BUILD", "\n".join([
        'load("@rules_cc//cc:defs.bzl", "cc_library")',
        'package(default_visibility = ["//visibility:public"])',
        "",
        "cc_library(",
        '    name = "python_headers",',
        '    hdrs = glob(["python_include/**/*.h"]),',
        '    includes = ["python_include"],',
        ")",
        "",
        "cc_library(",
        '    name = "xla_ffi",',
        '    hdrs = glob(["xla_include/xla/**/*.h"]),',
        '    includes = ["xla_include"],',
        ")",
        "",
        "cc_library(",
        '    name = "ibverbs_headers",',
        '    hdrs = glob(["ibverbs_include/**/*.h"]),',
        '    includes = ["ibverbs_include"],',
        ")",
        "",
        "# nanobind, built from the installed package's sources (as nanobind_add_module NB_STATIC).",
        "cc_library(",
        '    name = "nanobind",',
        "    srcs = [%s]," % ", ".join(['"nanobind/src/%s"' % s for s in _NANOBIND_SRCS]),
        '    hdrs = glob(["nanobind/include/**/*.h", "nanobind/src/*.h", "nanobind/ext/robin_map/include/**/*.h"]),',
        '    includes = ["nanobind/include", "nanobind/ext/robin_map/include"],',
        '    copts = ["-DNB_BUILD", "-fvisibility=hidden", "-w", "-Iexternal/%s/nanobind/src"],' % ctx.name,
        '    deps = [":python_headers"],',
        ")",
        "",
    ]))

r2ccl_toolchain_inputs = repository_rule(
    implementation = _impl,
    local = True,
    environ = ["R2CCL_PYTHON", "PYTHON_BIN_PATH", "PATH"],
)
