"""//deploy/k8s:manifests_test: the shipped kustomizations pass check.py, and
broken copies of them fail it with a message naming the problem.

Also runs the worker container's shell wrapper with a fake ps-worker (the
exit-0-then-idle rule, the exit status passed on, SIGTERM reaching the
worker), and, where a kubectl is installed, compares render.py's output with
`kubectl kustomize`'s. Needs deploy/k8s/setup.sh's tools: without them it
fails saying to run it.
"""

import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import yaml  # noqa: F401  (render.py needs it)
except ImportError:
    sys.exit("manifests_test: python3-yaml is missing: run `bash deploy/k8s/setup.sh`")

import check  # noqa: E402
import render  # noqa: E402

KUSTOMIZATIONS = ("base", "overlays/cpu", "overlays/gpu", "jobset")


def copy_tree(destination):
    """The manifests (base/, overlays/) copied into `destination`."""
    for part in ("base", "overlays", "jobset"):
        shutil.copytree(os.path.join(HERE, part), os.path.join(destination, part))
    return destination


def edit(root, relative, old, new):
    """Replaces the one occurrence of `old` in root/relative by `new`."""
    path = os.path.join(root, relative)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.count(old) != 1:
        raise AssertionError(f"{relative}: {old!r} occurs {text.count(old)} times, not once")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))


# Each broken copy: (name, edits [(file, old, new)], kustomization checked,
# texts every one of which the problems must contain).
BROKEN = [
    ("misspelled field",
     [("base/server.yaml", "readinessProbe:", "readinesProbe:")], "overlays/cpu",
     ["base/server.yaml", "StatefulSet/ps-server", "containers[server].readinesProbe",
      "'\"readinesProbe\"' does not exist in type 'Container'"]),
    ("wrong type",
     [("base/server.yaml", "replicas: 2", 'replicas: "two"')], "base",
     ["base/server.yaml", "StatefulSet/ps-server at spec.replicas",
      "Type 'string' is not assignable to type 'number'"]),
    ("misspelled field in an overlay's patch",
     [("overlays/gpu/worker-gpu.yaml", "          resources:", "          resource:")], "overlays/gpu",
     ["overlays/gpu/worker-gpu.yaml", "StatefulSet/ps-worker",
      "containers[worker].resource", "'\"resource\"' does not exist in type 'Container'"]),
    ("quantity written as a number",
     [("overlays/gpu/worker-gpu.yaml", 'nvidia.com/gpu: "1"', "nvidia.com/gpu: 1")], "overlays/gpu",
     ["overlays/gpu/worker-gpu.yaml", 'limits.nvidia.com/gpu',
      "Type 'number' is not assignable to type 'string'"]),
    ("misspelled field in a Service",
     [("base/server.yaml", "publishNotReadyAddresses: true", "publishNotReadyAdresses: true")], "base",
     ["Service/ps-server at spec.publishNotReadyAdresses", "does not exist in type 'ServiceSpec'"]),
    ("kustomization field the renderer does not support",
     [("overlays/cpu/kustomization.yaml", "resources:", "namePrefix: test-\nresources:")], "overlays/cpu",
     ["overlays/cpu/kustomization.yaml", "field 'namePrefix' is not supported"]),
    ("images entry matching nothing",
     [("overlays/gpu/kustomization.yaml", "- name: localhost/ps-worker\n", "- name: localhost/ps-wroker\n")],
     "overlays/gpu",
     ["images entry 'localhost/ps-wroker' matches no container image"]),
    ("patch of a resource that does not exist",
     [("overlays/gpu/worker-gpu.yaml", "name: ps-worker", "name: ps-workers")], "overlays/gpu",
     ["worker-gpu.yaml", "patch target StatefulSet/ps-workers is not among the resources"]),
    ("NUM_WORKERS disagreeing with the workers' replicas",
     [("base/job.env", "NUM_WORKERS=2", "NUM_WORKERS=3")], "base",
     ["NUM_WORKERS=3 but StatefulSet ps-worker has replicas 2"]),
    ("a shard added without its address",
     [("base/server.yaml", "replicas: 2", "replicas: 3")], "overlays/cpu",
     ["StatefulSet ps-server has replicas 3",
      "expected SERVERS=ps-server-0.ps-server:50051,ps-server-1.ps-server:50051,"
      "ps-server-2.ps-server:50051"]),
    ("undefined variable in the server's arguments",
     [("base/server.yaml", "--lr=$(LR)", "--lr=$(LEARNING_RATE)")], "base",
     ["container server: $(LEARNING_RATE)", "not defined"]),
    ("undefined variable in the worker's script",
     [("base/worker.yaml", '--epochs="$EPOCHS"', '--epochs="$EPOCS"')], "base",
     ["container worker: the shell script uses $EPOCS"]),
    ("Service target port naming no container port",
     [("base/server.yaml", "targetPort: metrics", "targetPort: metric")], "base",
     ["Service/ps-server", "targetPort 'metric' is no named port of its pods"]),
    ("misspelled JobSet field",
     [("jobset/jobset.yaml", "  successPolicy:", "  sucessPolicy:")], "jobset",
     ["jobset/jobset.yaml", "JobSet/ps-train at spec.sucessPolicy",
      "'\"sucessPolicy\"' does not exist in type 'JobSetSpec'"]),
    ("JobSet enum value misspelled",
     [("jobset/jobset.yaml", "startupPolicyOrder: InOrder", "startupPolicyOrder: Inorder")], "jobset",
     ["JobSet/ps-train at spec.startupPolicy.startupPolicyOrder",
      "Type '\"Inorder\"' is not assignable to type '\"AnyOrder\" | \"InOrder\"'"]),
    ("misspelled field in a JobSet's pod template",
     [("jobset/jobset.yaml", "                  readinessProbe:", "                  readinesProbe:")],
     "jobset",
     ["JobSet/ps-train at spec.replicatedJobs[server].template.spec.template.spec.containers[server]"
      ".readinesProbe", "does not exist in type 'Container'"]),
    ("JobSet whose workers' count disagrees with NUM_WORKERS",
     [("jobset/job.env", "NUM_WORKERS=2", "NUM_WORKERS=3")], "jobset",
     ["NUM_WORKERS=3 but the worker Job has completions 2"]),
    ("JobSet succeeding on the servers too",
     [("jobset/jobset.yaml", "targetReplicatedJobs: [worker]", "targetReplicatedJobs: [server, worker]")],
     "jobset", ["successPolicy.targetReplicatedJobs must be [worker]"]),
    ("duplicate key",
     [("base/worker.yaml", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n")], "base",
     ["worker.yaml", "duplicate key 'replicas'"]),
]


class ManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # One check (one tsc run) over the shipped kustomizations and every
        # broken copy.
        cls.work = tempfile.mkdtemp(prefix="manifests_test.", dir=os.environ.get("TEST_TMPDIR"))
        cls.shipped = {k: os.path.join(HERE, k) for k in KUSTOMIZATIONS}
        cls.broken = {}
        for number, (name, edits, kustomization, _) in enumerate(BROKEN):
            root = copy_tree(os.path.join(cls.work, f"broken{number}"))
            for relative, old, new in edits:
                edit(root, relative, old, new)
            cls.broken[name] = os.path.join(root, kustomization)
        try:
            cls.results = check.check(list(cls.shipped.values()) + list(cls.broken.values()))
        except check.SetupError as e:
            raise AssertionError(f"the manifest check's tools are missing: {e}") from e

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def test_shipped_kustomizations_pass(self):
        for kustomization, directory in self.shipped.items():
            with self.subTest(kustomization):
                self.assertEqual(self.results[directory], [], "\n".join(self.results[directory]))

    def test_broken_copies_fail_naming_the_problem(self):
        for name, _, _, expected in BROKEN:
            with self.subTest(name):
                problems = self.results[self.broken[name]]
                self.assertTrue(problems, f"{name}: the check passed")
                text = "\n".join(problems)
                for part in expected:
                    self.assertIn(part, text)
                print(f"{name}:\n  " + "\n  ".join(problems))

    def test_renderer_matches_kubectl_kustomize(self):
        kubectl = shutil.which("kubectl")
        if kubectl is None or subprocess.run([kubectl, "kustomize", "--help"], capture_output=True,
                                             timeout=60).returncode != 0:
            self.skipTest("no working kubectl here to cross-check render.py with")
        # Real files: kustomize does not read Bazel's runfiles symlinks.
        root = copy_tree(os.path.join(self.work, "kubectl"))
        for kustomization in KUSTOMIZATIONS:
            with self.subTest(kustomization):
                directory = os.path.join(root, kustomization)
                run = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True,
                                     timeout=60)
                self.assertEqual(run.returncode, 0, f"kubectl kustomize {kustomization}: {run.stderr}")
                theirs = {(o["apiVersion"], o["kind"], o["metadata"]["name"]): o
                          for o in yaml.safe_load_all(run.stdout) if o}
                ours = {r.key(): r.obj for r in render.render(directory)}
                self.assertEqual(sorted(ours), sorted(theirs))
                for key in ours:
                    self.assertEqual(ours[key], theirs[key], f"{kustomization}: {key}")


def container(resources, statefulset, name, init=False):
    obj = next(r.obj for r in resources if r.kind == "StatefulSet" and r.name == statefulset)
    pod = obj["spec"]["template"]["spec"]
    return next(c for c in pod["initContainers" if init else "containers"] if c["name"] == name)


FAKE_WORKER = """#!/usr/bin/env python3
import os, signal, sys, time
out = os.environ["FAKE_OUT"]
with open(out + ".argv", "w") as f:
    f.write("\\n".join(sys.argv[1:]))
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
mode = os.environ["FAKE_MODE"]
if mode != "train":
    sys.exit(int(mode))
open(out + ".training", "w").close()
while not stop:
    time.sleep(0.02)
time.sleep(0.3)  # the step in progress
open(out + ".stopped", "w").close()
sys.exit(143)
"""


FAKE_HEALTH = """#!/usr/bin/env python3
import os, sys
calls = os.environ["FAKE_OUT"] + ".calls"
with open(calls, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
with open(calls) as f:
    seen = f.read().splitlines()
# The second shard answers SERVING on its second check only.
sys.exit(1 if "ps-server-1" in sys.argv[1] and len([s for s in seen if "ps-server-1" in s]) < 2 else 0)
"""


class WaitForServersTest(unittest.TestCase):
    """The workers' init container checks every shard in SERVERS, in order,
    until each says SERVING (ps-health replaced by a fake, its 2 s pause
    shortened)."""

    def test_waits_for_every_shard(self):
        work = tempfile.mkdtemp(prefix="wait_test.", dir=os.environ.get("TEST_TMPDIR"))
        self.addCleanup(shutil.rmtree, work, True)
        resources = render.render(os.path.join(HERE, "overlays", "cpu"))
        init = container(resources, "ps-worker", "wait-for-servers", init=True)
        self.assertEqual(init["command"], ["/usr/bin/catatonit", "-g", "--", "/bin/sh", "-c"])
        fake = os.path.join(work, "ps-health")
        with open(fake, "w") as f:
            f.write(FAKE_HEALTH)
        os.chmod(fake, 0o755)
        script = init["args"][0]
        for old, new in (("/usr/local/bin/ps-health", fake), ("sleep 2", "sleep 0.1")):
            self.assertEqual(script.count(old), 1, old)
            script = script.replace(old, new)
        job = next(r.obj for r in resources if r.kind == "ConfigMap" and r.name == "ps-job")
        out = os.path.join(work, "health")
        env = dict(job["data"], PATH="/usr/bin:/bin", FAKE_OUT=out)
        run = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        with open(out + ".calls") as f:
            calls = f.read().splitlines()
        tls = " --tls_ca=/etc/ps/tls/ca.crt --tls_cert=/etc/ps/tls/tls.crt --tls_key=/etc/ps/tls/tls.key"
        self.assertEqual(calls, [
            "--address=ps-server-0.ps-server:50051 --timeout=2s" + tls,
            "--address=ps-server-1.ps-server:50051 --timeout=2s" + tls,
            "--address=ps-server-1.ps-server:50051 --timeout=2s" + tls,
        ])
        self.assertIn("waiting for the server shard at ps-server-1.ps-server:50051", run.stdout)


class WorkerWrapperTest(unittest.TestCase):
    """The worker container's `sh -c` script, run by /bin/sh (dash on Debian,
    as in the images) with ps-worker replaced by a fake. The shell is its
    own process group's leader and SIGTERM goes to the whole group, as
    `catatonit -g` does."""

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="wrapper_test.", dir=os.environ.get("TEST_TMPDIR"))
        resources = render.render(os.path.join(HERE, "overlays", "cpu"))
        worker = container(resources, "ps-worker", "worker")
        command = worker["command"]
        assert command[:3] == ["/usr/bin/catatonit", "-g", "--"] and command[3:] == ["/bin/sh", "-c"], command
        fake = os.path.join(cls.work, "ps-worker")
        with open(fake, "w") as f:
            f.write(FAKE_WORKER)
        os.chmod(fake, 0o755)
        script = worker["args"][0]
        assert script.count("/usr/local/bin/ps-worker") == 1
        cls.script = script.replace("/usr/local/bin/ps-worker", fake)
        job = next(r.obj for r in resources if r.kind == "ConfigMap" and r.name == "ps-job")
        cls.env = dict(job["data"], PATH="/usr/bin:/bin", HOSTNAME="ps-worker-1")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def start(self, mode):
        out = os.path.join(self.work, mode)
        process = subprocess.Popen(["/bin/sh", "-c", self.script],
                                   env=dict(self.env, FAKE_MODE=mode, FAKE_OUT=out),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.addCleanup(process.stdout.close)
        self.addCleanup(lambda: process.poll() is None and os.killpg(process.pid, signal.SIGKILL))
        return process, out

    @staticmethod
    def wait_for(path, timeout=10):
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} did not appear")
            time.sleep(0.02)

    def test_success_idles_and_stops_on_sigterm(self):
        process, out = self.start("0")
        self.wait_for(out + ".argv")
        with self.assertRaises(subprocess.TimeoutExpired):
            process.wait(timeout=1)  # idling, not restarted by an exit
        os.killpg(process.pid, signal.SIGTERM)
        self.assertEqual(process.wait(timeout=5), -signal.SIGTERM)  # catatonit: 143
        self.assertIn(b"training finished", process.stdout.read())
        with open(out + ".argv") as f:
            argv = f.read().split("\n")
        self.assertIn("--rank=1", argv)
        self.assertIn("--worker_id=ps-worker-1", argv)
        self.assertIn(f"--server={self.env['SERVERS']}", argv)
        self.assertIn("--job_token_file=/etc/ps/token/token", argv)
        self.assertIn("--tls_cert=/etc/ps/tls/tls.crt", argv)
        self.assertIn("--tls_key=/etc/ps/tls/tls.key", argv)
        self.assertIn("--tls_ca=/etc/ps/tls/ca.crt", argv)
        self.assertIn(f"--epochs={self.env['EPOCHS']}", argv)

    def test_failure_exits_with_the_workers_status(self):
        process, _ = self.start("3")
        self.assertEqual(process.wait(timeout=10), 3)

    def test_sigterm_reaches_the_worker_and_the_shell_waits_for_it(self):
        process, out = self.start("train")
        self.wait_for(out + ".training")
        os.killpg(process.pid, signal.SIGTERM)
        self.assertEqual(process.wait(timeout=10), 143)
        self.assertTrue(os.path.exists(out + ".stopped"), "the shell exited before the worker's step ended")
        self.assertNotIn(b"training finished", process.stdout.read())


def k8s_expand(text, env):
    """Kubernetes' $(VAR) expansion ($$ a literal $; an undefined $(VAR) stays)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def certificate_names(path):
    """(CN, [subjectAltName entries]) of a PEM certificate, by openssl."""
    run = subprocess.run(["openssl", "x509", "-in", path, "-noout", "-subject", "-ext", "subjectAltName"],
                         capture_output=True, text=True, check=True)
    cn = re.search(r"CN\s*=\s*([^,\n]+)", run.stdout).group(1).strip()
    sans = re.findall(r"(?:DNS|IP Address):([^,\s]+)", run.stdout)
    return cn, sans


class SecretsBase(unittest.TestCase):
    """deploy/k8s/make_secrets.sh's Secrets fit what the manifests mount and
    pass: each pod's subPathExpr names keys that exist, each worker's
    certificate names the --worker_id that pod passes (the server admits a
    registration for an id only from a certificate naming it), and each
    shard's certificate names the address the workers dial, for the
    StatefulSets and for the JobSet. What a kubelet would do is played here:
    $(VAR) expanded with the pod's name or its completion index."""

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="secrets_test.", dir=os.environ.get("TEST_TMPDIR"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def make(self, name, *args):
        out = os.path.join(self.work, name)
        run = subprocess.run(["bash", os.path.join(HERE, "make_secrets.sh"), out, *args],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(out, "secrets.yaml"), encoding="utf-8") as f:
            secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(f) if d}
        self.assertEqual(sorted(secrets), ["ps-job-token", "ps-server-tls", "ps-worker-tls"])
        self.assertEqual(oct(os.stat(os.path.join(out, "secrets.yaml")).st_mode & 0o777), "0o600")
        self.assertGreaterEqual(len(base64.b64decode(secrets["ps-job-token"]["data"]["token"]).strip()), 32)
        files = {}
        for secret in ("ps-server-tls", "ps-worker-tls"):
            folder = os.path.join(out, secret)
            os.makedirs(folder)
            for key, value in secrets[secret]["data"].items():
                with open(os.path.join(folder, key), "wb") as f:
                    f.write(base64.b64decode(value))
            files[secret] = folder
        for name in os.listdir(out):
            if name.endswith(".key"):
                self.assertEqual(oct(os.stat(os.path.join(out, name)).st_mode & 0o777), "0o600", name)
        # A second run into the same folder refuses to replace the CA.
        again = subprocess.run(["bash", os.path.join(HERE, "make_secrets.sh"), out, *args],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(again.returncode, 3, again.stderr)
        return files

    def check_pod(self, files, containers, env, worker_id=None, address=None):
        for c in containers:
            c_env = dict(env)
            for e in c.get("env") or []:
                if "value" in e:
                    c_env[e["name"]] = e["value"]
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts") or [] if m["name"] == "tls"}
            if not mounts:
                continue
            secret = files["ps-worker-tls" if worker_id else "ps-server-tls"]
            paths = {}
            for path, m in mounts.items():
                key = m.get("subPath") or k8s_expand(m["subPathExpr"], c_env)
                paths[path] = os.path.join(secret, key)
                self.assertTrue(os.path.exists(paths[path]), f"{c['name']}: no key {key} in the Secret")
            verify = subprocess.run(["openssl", "verify", "-CAfile", paths["/etc/ps/tls/ca.crt"],
                                     paths["/etc/ps/tls/tls.crt"]], capture_output=True, text=True)
            self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
            cn, sans = certificate_names(paths["/etc/ps/tls/tls.crt"])
            if worker_id:
                self.assertEqual((cn, sans), (worker_id, [worker_id]))
            else:
                self.assertIn(address.rsplit(":", 1)[0], sans)
                self.assertIn("localhost", sans)  # the probes' --tls_server_name



class StatefulSetSecretsTest(SecretsBase):
    def test_statefulsets(self):
        files = self.make("statefulset", "--servers=2", "--workers=2")
        resources = render.render(os.path.join(HERE, "overlays", "cpu"))
        job = next(r.obj for r in resources if r.kind == "ConfigMap" and r.name == "ps-job")["data"]
        addresses = job["SERVERS"].split(",")
        for i in range(2):
            for kind in ("server", "worker"):
                obj = next(r.obj for r in resources if r.kind == "StatefulSet" and r.name == f"ps-{kind}")
                pod = obj["spec"]["template"]["spec"]
                name = f"ps-{kind}-{i}"
                env = dict(job, POD_NAME=name, HOSTNAME=name)
                containers = (pod.get("initContainers") or []) + pod["containers"]
                if kind == "worker":
                    # The worker's script passes --worker_id="$HOSTNAME".
                    self.assertIn('--worker_id="$HOSTNAME"', pod["containers"][0]["args"][0])
                    self.check_pod(files, containers, env, worker_id=name)
                else:
                    advertised = k8s_expand(next(a for a in pod["containers"][0]["args"]
                                                 if a.startswith("--advertise_address=")), env)
                    self.assertEqual(advertised, f"--advertise_address={addresses[i]}")
                    self.check_pod(files, containers, env, address=addresses[i])


class JobSetTest(SecretsBase):
    """The JobSet's pods as the Job controller would make them (podman cannot
    play a JobSet): the completion index gives the worker its rank, its id
    w<index> and that id's certificate; the shard its address (the one in
    SERVERS), its certificate and its own checkpoint folder."""

    def test_pods_by_completion_index(self):
        resources = render.render(os.path.join(HERE, "jobset"))
        jobset = next(r.obj for r in resources if r.kind == "JobSet")
        job = next(r.obj for r in resources if r.kind == "ConfigMap")["data"]
        jobs = {j["name"]: j["template"]["spec"] for j in jobset["spec"]["replicatedJobs"]}
        self.assertEqual(jobset["spec"]["startupPolicy"], {"startupPolicyOrder": "InOrder"})
        self.assertEqual([j["name"] for j in jobset["spec"]["replicatedJobs"]], ["server", "worker"])
        self.assertEqual(jobset["spec"]["successPolicy"], {"operator": "All", "targetReplicatedJobs": ["worker"]})
        self.assertGreater(jobset["spec"]["failurePolicy"]["maxRestarts"], 0)
        self.assertIn("kueue.x-k8s.io/queue-name", jobset["metadata"]["labels"])
        files = self.make("jobset", "--servers=2", "--workers=2", "--jobset=ps-train")
        addresses = job["SERVERS"].split(",")
        checkpoint_dirs = set()
        for name in ("server", "worker"):
            pod = jobs[name]["template"]["spec"]
            container = pod["containers"][0]
            index_env = next(e for e in container["env"] if e["name"] == "JOB_COMPLETION_INDEX")
            self.assertEqual(index_env["valueFrom"]["fieldRef"]["fieldPath"],
                             "metadata.annotations['batch.kubernetes.io/job-completion-index']")
            for index in range(jobs[name]["completions"]):
                env = dict(job, JOB_COMPLETION_INDEX=str(index))
                args = [k8s_expand(a, env) for a in container["args"]]
                self.assertFalse([a for a in args if "$(" in a], args)
                self.assertFalse([a for a in args if "insecure" in a], "plaintext flags")
                if name == "worker":
                    self.assertIn(f"--rank={index}", args)
                    self.assertIn(f"--worker_id=w{index}", args)
                    self.assertIn(f"--server={job['SERVERS']}", args)
                    self.check_pod(files, [container], env, worker_id=f"w{index}")
                else:
                    self.assertIn(f"--advertise_address={addresses[index]}", args)
                    checkpoint_dirs.add(next(a for a in args if a.startswith("--checkpoint_dir=")))
                    self.check_pod(files, [container], env, address=addresses[index])
        self.assertEqual(len(checkpoint_dirs), jobs["server"]["completions"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
