"""python_package: a Python package as one directory of bazel-bin.

Bazel 4.2.3's py_* rules lay a package out only in a binary's runfiles (and
their stub runs `python`, which Debian 12 lacks), so this rule copies the
package's sources (subpackages kept) and its native library into one directory named after the
target, bazel-bin/<package>/<name>/, which PYTHONPATH=bazel-bin/<package>
imports as is, and which tests take as data.
"""

def _python_package_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    commands = ["mkdir -p '%s'" % out.path]

    # A source under <package>/<name>/ keeps its path below it (ps/torch/x.py
    # becomes <name>/torch/x.py); libraries and other sources go flat.
    prefix = (ctx.label.package + "/" if ctx.label.package else "") + ctx.label.name + "/"
    for f in ctx.files.srcs + ctx.files.libraries:
        relative = f.short_path[len(prefix):] if f.short_path.startswith(prefix) else f.basename
        if "/" in relative:
            commands.append("mkdir -p '%s/%s'" % (out.path, relative.rsplit("/", 1)[0]))
        commands.append("cp '%s' '%s/%s'" % (f.path, out.path, relative))
    ctx.actions.run_shell(
        inputs = ctx.files.srcs + ctx.files.libraries,
        outputs = [out],
        command = " && ".join(commands),
        progress_message = "Assembling the Python package %s" % ctx.label,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

python_package = rule(
    implementation = _python_package_impl,
    doc = "Copies `srcs` (.py files, their paths below <name>/ kept) and `libraries` into bazel-bin/<package>/<name>/.",
    attrs = {
        "srcs": attr.label_list(allow_files = [".py"]),
        "libraries": attr.label_list(allow_files = [".so"]),
    },
)
