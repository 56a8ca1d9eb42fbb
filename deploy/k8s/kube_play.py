#!/usr/bin/env python3
"""Turns a rendered overlay into Pods that `podman kube play` runs, for a
smoke run of the manifests' containers without a cluster: the real images,
commands, environment, security contexts and volumes, one pod per server
shard and per worker.

    python3 deploy/k8s/kube_play.py OVERLAY OUTDIR --servers=S --workers=W \\
        --secrets=SECRETS.yaml [--volume_prefix=P] [--set KEY=VALUE ...]

writes OUTDIR/ps-server-N.yaml and OUTDIR/ps-worker-N.yaml (each a ConfigMap
and a Pod), to be played on one podman network with the dnsname plugin:

    podman network create NET
    podman kube play --network NET OUTDIR/ps-server-0.yaml   # each shard
    podman kube play --network NET OUTDIR/ps-worker-0.yaml   # each worker

Podman 4.3 is not a kubelet; what this changes, and why (each a podman
limit, none a change of what the containers do):
  - a StatefulSet is not played: its pod template becomes Pods named as the
    StatefulSet's pods are (ps-server-0, ps-worker-0, ...), with the pod's
    hostname set to that name;
  - headless-Service names do not resolve: SERVERS lists the shard pods by
    pod name (ps-server-0:50051), which podman's DNS resolves;
  - $(VAR) in command and args is expanded here, as the kubelet does
    (podman passes it through literally); $$ stands for $;
  - Secret volumes make podman 4.3 crash: the Secrets of --secrets (the
    file deploy/k8s/make_secrets.sh writes) are unpacked into
    OUTDIR/secrets/SECRET/KEY, owned by the pods' runAsUser when run as root
    (the kubelet's defaultMode and fsGroup, which podman ignores), each
    Secret volume becomes a hostPath of its folder and a mount of one key
    (subPath, or subPathExpr with $(VAR) expanded as the kubelet does) a
    hostPath of that file;
  - podman makes an emptyDir a named volume called as the pod's volume, so
    pods would share it (two shards writing one checkpoint folder): every
    emptyDir, and each volumeClaimTemplate (one per pod, as the StatefulSet
    controller makes them), becomes an emptyDir named PREFIX-POD-NAME
    (--volume_prefix; `podman volume rm` them after `podman kube down`);
  - containerPorts are dropped: podman publishes each on the host, so a
    second shard's metrics port collides with the first's (the pods reach
    each other over the network, as in a cluster);
  - restartPolicy becomes OnFailure: under Always podman 4.3 runs init
    containers again and again and never starts the main container.
--set KEY=VALUE overrides an entry of the ConfigMap ps-job (EPOCHS=1, ...);
NUM_WORKERS is --workers.
"""

import argparse
import base64
import copy
import os
import re
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render  # noqa: E402  (beside this file)

SERVER_PORT = 50051
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text, env):
    """Kubernetes' $(VAR) expansion: defined variables are replaced, $$ is a
    literal $, an undefined $(VAR) stays as written."""
    def replace(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _REFERENCE.sub(replace, text)


def container_env(container, config, pod_name):
    """What the container's $(VAR) may refer to: envFrom ConfigMaps, then
    env entries (literal values and the pod's name)."""
    env = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(config)
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[e["name"]] = pod_name
    return env


def pod_from(statefulset, name, config, secrets_dir, volume_prefix):
    template = copy.deepcopy(statefulset["spec"]["template"])
    spec = template["spec"]
    spec["hostname"] = name
    spec["restartPolicy"] = "OnFailure"
    volumes = spec.setdefault("volumes", [])
    for claim in statefulset["spec"].get("volumeClaimTemplates", []):
        volumes.append({"name": claim["metadata"]["name"], "emptyDir": {}})
    renamed, secrets = {}, {}
    for v in volumes:
        if "secret" in v:
            secrets[v["name"]] = os.path.join(secrets_dir, v.pop("secret")["secretName"])
            v["hostPath"] = {"path": secrets[v["name"]], "type": "Directory"}
        if "emptyDir" in v:
            renamed[v["name"]] = "-".join(p for p in (volume_prefix, name, v["name"]) if p)
            v["name"] = renamed[v["name"]]
    for c in spec.get("initContainers", []) + spec["containers"]:
        c.pop("ports", None)
        env = container_env(c, config, name)
        for mount in c.get("volumeMounts", []):
            mount["name"] = renamed.get(mount["name"], mount["name"])
            key = mount.pop("subPath", None) or expand(mount.pop("subPathExpr", ""), env)
            if key and mount["name"] in secrets:
                file_volume = f"{mount['name']}-{len(volumes)}"
                volumes.append({"name": file_volume, "hostPath": {
                    "path": os.path.join(secrets[mount["name"]], key), "type": "File"}})
                mount["name"] = file_volume
            elif key:
                raise ValueError(f"{name}: a subPath on volume {mount['name']} is not supported here")
        for key in ("command", "args"):
            if key in c:
                c[key] = [expand(a, env) for a in c[key]]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"].get("labels", {})},
        "spec": spec,
    }


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overlay")
    parser.add_argument("outdir")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--secrets", required=True, metavar="SECRETS.yaml")
    parser.add_argument("--volume_prefix", default="")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv[1:])

    try:
        objects = {(r.obj["kind"], r.obj["metadata"]["name"]): r.obj
                   for r in render.render(args.overlay)}
    except render.RenderError as e:
        print(f"kube_play.py: {e}", file=sys.stderr)
        return 1
    config_map = copy.deepcopy(objects[("ConfigMap", "ps-job")])
    config = config_map.setdefault("data", {})
    for assignment in args.set:
        key, sep, value = assignment.partition("=")
        if not sep or key not in config:
            print(f"kube_play.py: --set {assignment}: not KEY=VALUE of a key of ps-job",
                  file=sys.stderr)
            return 2
        config[key] = value
    config["NUM_WORKERS"] = str(args.workers)
    config["SERVERS"] = ",".join(f"ps-server-{s}:{SERVER_PORT}" for s in range(args.servers))

    os.makedirs(args.outdir, exist_ok=True)
    secrets_dir = os.path.abspath(os.path.join(args.outdir, "secrets"))
    owner = next((s["spec"]["template"]["spec"].get("securityContext", {}).get("runAsUser")
                  for (kind, _), s in objects.items() if kind == "StatefulSet"), None)
    with open(args.secrets, encoding="utf-8") as f:
        for secret in yaml.safe_load_all(f):
            if not secret:
                continue
            folder = os.path.join(secrets_dir, secret["metadata"]["name"])
            os.makedirs(folder, exist_ok=True)
            for key, value in (secret.get("data") or {}).items():
                path = os.path.join(folder, key)
                with open(path, "wb") as out:
                    out.write(base64.b64decode(value))
                os.chmod(path, 0o400)
                if owner is not None and os.geteuid() == 0:
                    os.chown(path, owner, owner)
    for kind, count in (("server", args.servers), ("worker", args.workers)):
        statefulset = objects[("StatefulSet", f"ps-{kind}")]
        for i in range(count):
            name = f"ps-{kind}-{i}"
            pod = pod_from(statefulset, name, config, secrets_dir,
                           args.volume_prefix)
            with open(os.path.join(args.outdir, f"{name}.yaml"), "w") as out:
                yaml.safe_dump_all([config_map, pod], out, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
