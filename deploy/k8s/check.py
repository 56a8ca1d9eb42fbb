#!/usr/bin/env python3
"""The offline, strict check of the Kubernetes manifests: no cluster, no kubectl.

    python3 deploy/k8s/check.py [KUSTOMIZATION_DIR...]   # default: base and every overlay

For each kustomization:
  1. render it (render.py: the subset of kustomize deploy/k8s uses);
  2. type-check every rendered object as a TypeScript object literal of its
     kind's type from npm's kubernetes-types (`const o0: StatefulSet = {...}`)
     with `tsc --noEmit --strict`: object-literal excess-property checks
     catch a misspelled field anywhere (`readinesProbe`), type checks a wrong
     type (`replicas: "two"`), and missing required fields are reported;
  3. cross-check what no schema sees: references between objects (ConfigMaps,
     Secrets, volumes, Services' selectors and target ports, StatefulSets'
     governing Services), every $(VAR) and shell $VAR a container uses being
     defined, and this job's own rules (NUM_WORKERS equal to ps-worker's
     replicas, SERVERS naming exactly ps-server's pods in order).
Each problem names the kustomization, the file it comes from (the resource
file, or the patch that brought the field in), the object and the field.

typescript and kubernetes-types are found in $PS_K8S_CHECK_DIR/node_modules
(default /var/cache/ps-k8s-check/node_modules), where deploy/k8s/setup.sh
installs them; Node.js is /usr/bin/node or the `node` on PATH.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render  # noqa: E402  (beside this file)

DEFAULT_CHECK_DIR = "/var/cache/ps-k8s-check"

# apiVersion, kind -> (module of kubernetes-types, type name).
KINDS = {
    ("v1", "ConfigMap"): ("kubernetes-types/core/v1", "ConfigMap"),
    ("v1", "Secret"): ("kubernetes-types/core/v1", "Secret"),
    ("v1", "Service"): ("kubernetes-types/core/v1", "Service"),
    ("v1", "PersistentVolumeClaim"): ("kubernetes-types/core/v1", "PersistentVolumeClaim"),
    ("v1", "ServiceAccount"): ("kubernetes-types/core/v1", "ServiceAccount"),
    ("apps/v1", "StatefulSet"): ("kubernetes-types/apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"): ("kubernetes-types/apps/v1", "Deployment"),
    ("policy/v1", "PodDisruptionBudget"): ("kubernetes-types/policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("kubernetes-types/networking/v1", "NetworkPolicy"),
    ("batch/v1", "Job"): ("kubernetes-types/batch/v1", "Job"),
    # Not in kubernetes-types: our own types of JobSet's API (types/jobset.ts,
    # written from its Go types), copied beside the checked files.
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): ("./jobset", "JobSet"),
}
LOCAL_TYPES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "types")

# Secrets the manifests mount that are made outside the kustomization (by
# deploy/k8s/make_secrets.sh or cert-manager), so that no key or token is
# in git; the keys each must hold.
EXTERNAL_SECRETS = {
    "ps-job-token": "token",
    "ps-server-tls": "ca.crt, <pod name>.crt, <pod name>.key",
    "ps-worker-tls": "ca.crt, <worker id>.crt, <worker id>.key",
}

# tsc's diagnostics: FILE(LINE,COL): error TSNNNN: MESSAGE, continued on
# indented lines.
DIAGNOSTIC = re.compile(
    r"^(?P<file>[^()]+)\((?P<line>\d+),(?P<col>\d+)\): error (?P<code>TS\d+): (?P<msg>.*)$")


class SetupError(Exception):
    """The check's tools are missing: run deploy/k8s/setup.sh."""


def tools():
    """(node, tsc script, node_modules folder), or SetupError saying what to run."""
    check_dir = os.environ.get("PS_K8S_CHECK_DIR", DEFAULT_CHECK_DIR)
    node_modules = os.path.join(check_dir, "node_modules")
    tsc = os.path.join(node_modules, "typescript", "bin", "tsc")
    hint = ("run `bash deploy/k8s/setup.sh` (as root) first; it installs them into "
            f"{DEFAULT_CHECK_DIR} or $PS_K8S_CHECK_DIR")
    node = "/usr/bin/node" if os.access("/usr/bin/node", os.X_OK) else shutil.which("node")
    if not node:
        raise SetupError(f"Node.js (node) is not installed: {hint}")
    for required in (tsc, os.path.join(node_modules, "kubernetes-types", "package.json")):
        if not os.path.exists(required):
            raise SetupError(f"{required} is missing: {hint}")
    return node, tsc, node_modules


# --- 2. TypeScript -------------------------------------------------------


def _identity(element):
    """How a list element is named in a path: its merge key, else None."""
    if isinstance(element, dict):
        for key in ("name", "mountPath"):
            if isinstance(element.get(key), str):
                return key, element[key]
    return None


def format_path(path):
    out = ""
    for step in path:
        if isinstance(step, str):
            out += ("." if out else "") + step
        else:
            index, identity = step
            out += f"[{identity[1]}]" if identity else f"[{index}]"
    return out


def _emit(value, path, indent, prefix, suffix, lines):
    """Appends `value` as TypeScript, one member a line, each line recorded
    with the path of the member it holds."""
    pad = "  " * indent
    if isinstance(value, dict) and value:
        lines.append((f"{pad}{prefix}{{", path))
        for key, member in value.items():
            _emit(member, path + (str(key),), indent + 1, json.dumps(str(key)) + ": ", ",", lines)
        lines.append((f"{pad}}}{suffix}", path))
    elif isinstance(value, list) and value:
        lines.append((f"{pad}{prefix}[", path))
        for index, element in enumerate(value):
            _emit(element, path + ((index, _identity(element)),), indent + 1, "", ",", lines)
        lines.append((f"{pad}]{suffix}", path))
    else:
        lines.append((f"{pad}{prefix}{json.dumps(value)}{suffix}", path))


def to_typescript(resources):
    """(source text, [(resource, path) or None per line]) for the rendered
    `resources`; raises render.RenderError for a kind without a type."""
    imports = {}
    for r in resources:
        typed = KINDS.get((r.obj["apiVersion"], r.kind))
        if typed is None:
            raise render.RenderError(
                f"{r.origin}: {r.obj['apiVersion']} {r.kind} {r.name}: no kubernetes-types type "
                "is known for this kind; add it to KINDS in deploy/k8s/check.py")
        imports.setdefault(typed[0], set()).add(typed[1])
    lines = [(f"import type {{ {', '.join(sorted(names))} }} from {json.dumps(module)};", None)
             for module, names in sorted(imports.items())]
    owners = [None] * len(lines)
    for index, r in enumerate(resources):
        body = []
        _emit(r.obj, (), 0, f"export const o{index}: {KINDS[(r.obj['apiVersion'], r.kind)][1]} = ",
              ";", body)
        for text, path in body:
            lines.append((text, path))
            owners.append((r, path))
    return "\n".join(text for text, _ in lines) + "\n", owners


def _origin(resource, path):
    """The file a field at `path` of `resource` comes from: the last patch
    holding it, else the file that defined the resource."""
    for source, patch in reversed(resource.patches):
        node, found = patch, True
        for step in path:
            if isinstance(step, str):
                if isinstance(node, dict) and step in node:
                    node = node[step]
                    continue
            elif isinstance(node, list):
                index, identity = step
                if identity:
                    named = [e for e in node if isinstance(e, dict) and e.get(identity[0]) == identity[1]]
                    if named:
                        node = named[0]
                        continue
                elif index < len(node):
                    node = node[index]
                    continue
            found = False
            break
        if found:
            return source
    return resource.origin


def typecheck(variants):
    """tsc over every variant at once (one Node.js start): {label: [problem]}
    for `variants`, a {label: [render.Resource]}."""
    node, tsc, node_modules = tools()
    problems = {label: [] for label in variants}
    with tempfile.TemporaryDirectory(prefix="ps-k8s-check.") as work:
        os.symlink(node_modules, os.path.join(work, "node_modules"))
        for name in os.listdir(LOCAL_TYPES):
            shutil.copy(os.path.join(LOCAL_TYPES, name), work)
        files, owners = {}, {}
        for number, (label, resources) in enumerate(variants.items()):
            try:
                text, line_owners = to_typescript(resources)
            except render.RenderError as e:
                problems[label].append(str(e))
                continue
            name = f"v{number}.ts"
            with open(os.path.join(work, name), "w", encoding="utf-8") as f:
                f.write(text)
            files[name], owners[name] = label, line_owners
        if not files:
            return problems
        result = subprocess.run(
            [node, tsc, "--noEmit", "--strict", "--pretty", "false", "--skipLibCheck",
             "--target", "es2020", "--lib", "es2020", "--module", "commonjs",
             "--moduleResolution", "node10", *sorted(files)],
            cwd=work, capture_output=True, text=True, timeout=300)
        current = None
        for raw in result.stdout.splitlines():
            match = DIAGNOSTIC.match(raw)
            if match is None:
                if current is not None and raw.strip():
                    current[1].append(raw.strip())
                continue
            name = os.path.basename(match["file"])
            if name not in files:
                problems.setdefault("tsc", []).append(raw)
                current = None
                continue
            line = int(match["line"]) - 1
            owner = owners[name][line] if line < len(owners[name]) else None
            if owner is None:
                where = f"{name} line {line + 1}"
            else:
                resource, path = owner
                where = (f"{_origin(resource, path)}: {resource.describe()} at "
                         f"{format_path(path) or '(the object)'}")
            current = (files[name], [f"{where}: {match['code']}: {match['msg']}"])
            problems[files[name]].append(current[1])
        for label in problems:
            problems[label] = [p if isinstance(p, str) else "\n    ".join(p) for p in problems[label]]
        if result.returncode != 0 and not any(problems.values()):
            raise RuntimeError(f"tsc failed without diagnostics:\n{result.stdout}{result.stderr}")
    return problems


# --- 3. What no schema sees ----------------------------------------------


def _pod_spec(obj):
    spec = obj.get("spec") or {}
    if obj.get("kind") in ("StatefulSet", "Deployment"):
        template = spec.get("template") or {}
        return template.get("metadata", {}).get("labels") or {}, template.get("spec") or {}
    return None, None


def _pod_templates(r):
    """(resource, labels, pod spec, replicated Job or None) for each pod
    template of a workload: a StatefulSet's or Deployment's one, a JobSet's
    one per replicated Job."""
    if r.kind == "JobSet":
        out = []
        for job in (r.obj.get("spec") or {}).get("replicatedJobs") or []:
            template = (((job.get("template") or {}).get("spec") or {}).get("template") or {})
            out.append((r, template.get("metadata", {}).get("labels") or {},
                        template.get("spec") or {}, job))
        return out
    labels, pod = _pod_spec(r.obj)
    return [] if pod is None else [(r, labels, pod, None)]


SHELL_VAR = re.compile(r"\$\{?([A-Z_][A-Z0-9_]*)")
K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def semantic_problems(resources):
    """Problems of references and of this job's rules in one rendered variant."""
    problems = []
    by_kind = {}
    for r in resources:
        by_kind.setdefault(r.kind, {})[r.name] = r
    configmaps, secrets = by_kind.get("ConfigMap", {}), by_kind.get("Secret", {})
    templates = [t for r in resources for t in _pod_templates(r)]
    pods = [(r, labels, pod) for r, labels, pod, _ in templates]
    claims_here = by_kind.get("PersistentVolumeClaim", {})

    def report(r, what):
        problems.append(f"{r.origin}: {r.describe()}: {what}")

    for r, labels, pod, job in templates:
        spec = r.obj.get("spec") or {}
        if job is not None:
            who = f"replicated job {job.get('name')}: "
            for volume in pod.get("volumes") or []:
                claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                if claim is not None and claim not in claims_here:
                    report(r, f"{who}volume {volume.get('name')}: PersistentVolumeClaim {claim!r} is not defined")
        else:
            selector = (spec.get("selector") or {}).get("matchLabels") or {}
            if not selector or any(labels.get(k) != v for k, v in selector.items()):
                report(r, f"spec.selector.matchLabels {selector} does not match the template's labels {labels}")
        if r.kind == "StatefulSet":
            service = by_kind.get("Service", {}).get(spec.get("serviceName"))
            if service is None:
                report(r, f"spec.serviceName {spec.get('serviceName')!r} names no Service here")
            elif (service.obj.get("spec") or {}).get("clusterIP") != "None":
                report(r, f"its governing Service {service.name} is not headless (clusterIP: None)")
        volumes = {v.get("name"): v for v in pod.get("volumes") or []}
        claims = {c.get("metadata", {}).get("name") for c in spec.get("volumeClaimTemplates") or []}
        for volume in volumes.values():
            for field, ref, objects, kind in (("secret", "secretName", secrets, "Secret"),
                                              ("configMap", "name", configmaps, "ConfigMap")):
                source = volume.get(field)
                if field == "secret" and source and source.get(ref) in EXTERNAL_SECRETS:
                    continue
                if source and not source.get("optional") and source.get(ref) not in objects:
                    report(r, f"volume {volume['name']}: {kind} {source.get(ref)!r} is not defined")
        containers = (pod.get("initContainers") or []) + (pod.get("containers") or [])
        names = [c.get("name") for c in containers]
        for name in sorted({n for n in names if names.count(n) > 1}, key=str):
            report(r, f"two containers are named {name!r}")
        for c in containers:
            who = f"container {c.get('name')}"
            if not isinstance(c.get("image"), str) or not c.get("image"):
                report(r, f"{who} has no image")
            for mount in c.get("volumeMounts") or []:
                if mount.get("name") not in volumes and mount.get("name") not in claims:
                    report(r, f"{who}: volumeMount {mount.get('mountPath')} uses volume "
                              f"{mount.get('name')!r}, which is neither a volume nor a volumeClaimTemplate")
            defined = {e.get("name") for e in c.get("env") or []}
            for source in c.get("envFrom") or []:
                for field, objects in (("configMapRef", configmaps), ("secretRef", secrets)):
                    if field not in source:
                        continue
                    ref = source[field].get("name")
                    if ref in objects:
                        defined |= set((objects[ref].obj.get("data") or {}).keys())
                    elif not source[field].get("optional"):
                        report(r, f"{who}: envFrom {field} {ref!r} is not defined")
            words = [w for w in (c.get("command") or []) + (c.get("args") or []) if isinstance(w, str)]
            for word in words:
                for var in K8S_VAR.findall(word):
                    if var not in defined:
                        report(r, f"{who}: $({var}) in its command or arguments is not defined "
                                  "(Kubernetes would pass it on unexpanded)")
            command = c.get("command") or []
            shell = len(command) >= 2 and os.path.basename(str(command[-2])) in ("sh", "bash")
            if shell and command[-1] == "-c":
                for script in c.get("args") or []:
                    for var in sorted(set(SHELL_VAR.findall(str(script))) - defined):
                        report(r, f"{who}: the shell script uses ${var}, which is not in its environment")

    def named_ports(selected):
        return {cp.get("name") for _, _, pod in selected for c in pod.get("containers") or []
                for cp in c.get("ports") or []}

    selecting = [r for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy")
                 for r in by_kind.get(kind, {}).values()]
    for r in selecting:
        spec = r.obj.get("spec") or {}
        selector = {
            "Service": lambda: spec.get("selector") or {},
            "PodDisruptionBudget": lambda: (spec.get("selector") or {}).get("matchLabels") or {},
            "NetworkPolicy": lambda: (spec.get("podSelector") or {}).get("matchLabels") or {},
        }[r.kind]()
        selected = [(p, labels, pod) for p, labels, pod in pods
                    if selector and all(labels.get(k) == v for k, v in selector.items())]
        if not selected:
            report(r, f"selector {selector} selects no pod template here")
        if r.kind == "Service":
            targets = [(f"port {p.get('name')}: targetPort", p.get("targetPort"))
                       for p in spec.get("ports") or []]
        elif r.kind == "NetworkPolicy":
            targets = [(f"ingress rule {i + 1}: port", p.get("port"))
                       for i, rule in enumerate(spec.get("ingress") or []) for p in rule.get("ports") or []]
        else:
            targets = []
        for what, target in targets:
            if isinstance(target, str) and target not in named_ports(selected):
                report(r, f"{what} {target!r} is no named port of its pods")

    # A JobSet's job: NUM_WORKERS is the worker Job's completions, SERVERS
    # the server pods' stable host names, and the success policy waits for
    # the workers only.
    for r in by_kind.get("JobSet", {}).values():
        spec = r.obj.get("spec") or {}
        jobs = {j.get("name"): j for j in spec.get("replicatedJobs") or []}
        subdomain = (spec.get("network") or {}).get("subdomain") or r.name
        if set(jobs) != {"server", "worker"}:
            report(r, f"replicated jobs {sorted(jobs, key=str)}: expected server and worker")
            continue
        counts = {}
        for name, job in jobs.items():
            job_spec = (job.get("template") or {}).get("spec") or {}
            counts[name] = job_spec.get("completions")
            if job_spec.get("completionMode") != "Indexed" or job.get("replicas", 1) != 1:
                report(r, f"replicated job {name}: one Indexed Job (replicas 1), whose completion "
                          "index is the shard or the rank, is expected")
            if job_spec.get("parallelism") != counts[name]:
                report(r, f"replicated job {name}: parallelism {job_spec.get('parallelism')} differs "
                          f"from completions {counts[name]}: every shard and rank must run at once")
        pod_env = {}
        for _, _, pod, job in templates:
            if job is not None and job.get("name") in jobs:
                for c in pod.get("containers") or []:
                    for source in c.get("envFrom") or []:
                        ref = (source.get("configMapRef") or {}).get("name")
                        if ref in configmaps:
                            pod_env = (configmaps[ref].obj.get("data") or {})
        if not all(isinstance(n, int) for n in counts.values()):
            continue
        if pod_env.get("NUM_WORKERS") != str(counts["worker"]):
            report(r, f"NUM_WORKERS={pod_env.get('NUM_WORKERS')} but the worker Job has completions "
                      f"{counts['worker']}: the completion indexes are the ranks, so they must agree")
        expected = ",".join(f"{r.name}-server-0-{i}.{subdomain}:50051" for i in range(counts["server"]))
        if pod_env.get("SERVERS") != expected:
            report(r, f"SERVERS={pod_env.get('SERVERS')} but the server Job has completions "
                      f"{counts['server']}: expected SERVERS={expected}")
        success = spec.get("successPolicy") or {}
        if success.get("targetReplicatedJobs") != ["worker"]:
            report(r, "successPolicy.targetReplicatedJobs must be [worker]: the servers never "
                      "complete by themselves")

    # This job's rules: the ranks and the shard list agree with the pods.
    job = configmaps.get("ps-job")
    statefulsets = by_kind.get("StatefulSet", {})
    if job is not None and "ps-worker" in statefulsets and "ps-server" in statefulsets:
        data = job.obj.get("data") or {}
        workers = statefulsets["ps-worker"].obj["spec"].get("replicas", 1)
        shards = statefulsets["ps-server"].obj["spec"].get("replicas", 1)
        if not isinstance(workers, int) or not isinstance(shards, int):
            return problems  # tsc reports the type
        if data.get("NUM_WORKERS") != str(workers):
            report(job, f"NUM_WORKERS={data.get('NUM_WORKERS')} but StatefulSet ps-worker has "
                        f"replicas {workers}: the pods' ordinals are the ranks, so they must agree")
        expected = ",".join(f"ps-server-{i}.ps-server:50051" for i in range(shards))
        if data.get("SERVERS") != expected:
            report(job, f"SERVERS={data.get('SERVERS')} but StatefulSet ps-server has replicas "
                        f"{shards}: expected SERVERS={expected}")
    return problems


# --- All of it -----------------------------------------------------------


def check(directories):
    """{directory: [problem]} for each kustomization directory; an empty list
    is a pass. Raises SetupError when the tools are missing."""
    tools()
    problems, variants = {}, {}
    for directory in directories:
        try:
            resources = render.render(directory)
        except render.RenderError as e:
            problems[directory] = [f"render: {e}"]
            continue
        variants[directory] = resources
        problems[directory] = semantic_problems(resources)
    for directory, typed in typecheck(variants).items():
        problems.setdefault(directory, []).extend(typed)
    return problems


def default_directories():
    here = os.path.dirname(os.path.abspath(__file__))
    overlays = os.path.join(here, "overlays")
    return [os.path.join(here, "base"), os.path.join(here, "jobset")] + sorted(
        os.path.join(overlays, d) for d in os.listdir(overlays)
        if os.path.isdir(os.path.join(overlays, d)))


def main(argv):
    directories = argv[1:] or default_directories()
    try:
        results = check(directories)
    except SetupError as e:
        print(f"check.py: {e}", file=sys.stderr)
        return 2
    failed = 0
    for directory in directories:
        found = results.get(directory, [])
        print(f"{'FAIL' if found else 'ok  '} {directory}")
        for problem in found:
            print(f"  {problem}")
        failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
