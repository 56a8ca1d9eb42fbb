#!/usr/bin/env python3
"""Renders a kustomization the way `kubectl kustomize` does, for the subset
of kustomize that deploy/k8s uses, so the manifest check needs no kubectl.

    python3 deploy/k8s/render.py deploy/k8s/overlays/cpu   # YAML on stdout

Supported, and nothing else (any other kustomization field, generator
option or patch form is refused with an error naming it, so the output never
silently differs from kustomize's):

  resources          YAML files (several documents each) and directories
                     holding a kustomization.yaml, processed recursively
  configMapGenerator name, envs (KEY=VALUE files), literals, behavior
                     create or merge
  secretGenerator    name, files (KEY=PATH or PATH), literals, type, behavior
                     create or merge
  generatorOptions   only disableNameSuffixHash: true (names stay as written)
  patches            strategic-merge patches, path or inline patch, matched
                     to a resource by apiVersion, kind and metadata.name
  images             name with newName and/or newTag, applied to containers
                     and initContainers after the patches, as kustomize does

Strategic merge, as kustomize does it: maps merge recursively, a null value
deletes the key; the lists containers and initContainers (by name), env (by
name), volumes (by name) and volumeMounts (by mountPath) merge element by
element, the patch's elements first in the patch's order followed by the
original's other elements in their order (checked against kubectl
kustomize 5.5); lists of scalars and tolerations, envFrom,
volumeClaimTemplates and args-like lists are replaced. Other lists of
objects (ports among them, whose kustomize merge by containerPort and
protocol has corner cases) are refused in patches, as are `$patch`
directives.

Stricter than kustomize on purpose (an error, never a silent difference):
duplicate keys in a YAML mapping, an `images` entry that matches no image,
a generator file outside its kustomization's folder, quotes or trailing
blanks in env-file values, and duplicate resources.
"""

import base64
import copy
import os
import sys

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
KUSTOMIZATION_FIELDS = {
    "apiVersion", "kind", "resources", "configMapGenerator", "secretGenerator",
    "generatorOptions", "patches", "images",
}
GENERATOR_FIELDS = {
    "configMapGenerator": {"name", "envs", "literals", "behavior"},
    "secretGenerator": {"name", "files", "literals", "type", "behavior"},
}
IMAGE_FIELDS = {"name", "newName", "newTag"}
PATCH_FIELDS = {"path", "patch"}

# Lists of objects a patch may merge, by field name: the merge key.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
}
# Lists of objects strategic merge replaces whole (no merge key in the API).
REPLACED_OBJECT_LISTS = {"tolerations", "envFrom", "volumeClaimTemplates", "items",
                         "matchExpressions", "accessModes"}

# kustomize's legacy output order (the default of kubectl kustomize).
KIND_ORDER = [
    "Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition",
    "ServiceAccount", "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding",
    "ClusterRoleBinding", "ConfigMap", "Secret", "Endpoints", "Service", "LimitRange",
    "PriorityClass", "PersistentVolume", "PersistentVolumeClaim", "Deployment",
    "StatefulSet", "CronJob", "PodDisruptionBudget",
]


class RenderError(Exception):
    """A kustomization this renderer refuses or cannot build; says which file."""


class Resource:
    """One rendered object, with where it came from: `origin` is the file (and
    document) that defined it, `patches` the patch files applied to it in
    order, each as (file, patch object)."""

    def __init__(self, obj, origin):
        self.obj = obj
        self.origin = origin
        self.patches = []

    @property
    def kind(self):
        return self.obj.get("kind")

    @property
    def name(self):
        return self.obj.get("metadata", {}).get("name")

    def key(self):
        return (self.obj.get("apiVersion"), self.kind, self.name)

    def describe(self):
        return f"{self.kind}/{self.name}"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (kustomize's YAML
    parser does too) and keeps dates as strings (Kubernetes has no dates)."""


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    mapping = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_documents(path):
    """The non-empty YAML documents of `path`, strictly parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return [d for d in yaml.load_all(f, Loader=_StrictLoader) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise RenderError(f"{path}: {e}") from e


def _kustomization_file(directory):
    for name in KUSTOMIZATION_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise RenderError(f"{directory}: no kustomization.yaml")


def _inside(root, relative, what, kfile):
    """`relative` resolved inside `root`, refused when it leaves it (kustomize's
    default load restrictor)."""
    if os.path.isabs(relative):
        raise RenderError(f"{kfile}: {what} {relative!r}: absolute paths are not allowed")
    path = os.path.normpath(os.path.join(root, relative))
    if os.path.commonpath([os.path.abspath(root), os.path.abspath(path)]) != os.path.abspath(root):
        raise RenderError(f"{kfile}: {what} {relative!r} is outside {root}")
    return path


def _check_fields(obj, allowed, where):
    if not isinstance(obj, dict):
        raise RenderError(f"{where}: expected a mapping, got {type(obj).__name__}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise RenderError(
            f"{where}: field {unknown[0]!r} is not supported by deploy/k8s/render.py "
            f"(supported: {', '.join(sorted(allowed))}); extend the renderer and its "
            "cross-check with kubectl kustomize before using it")


def _check_resource(obj, where):
    if not isinstance(obj, dict):
        raise RenderError(f"{where}: a resource must be a mapping")
    for field in ("apiVersion", "kind"):
        if not isinstance(obj.get(field), str):
            raise RenderError(f"{where}: resource without {field}")
    if obj["kind"] == "List" or obj["kind"].endswith("List"):
        raise RenderError(f"{where}: kind {obj['kind']} is not supported")
    name = obj.get("metadata", {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    if not isinstance(name, str):
        raise RenderError(f"{where}: {obj['kind']} without metadata.name")


def _parse_env_file(path, kfile):
    """KEY=VALUE lines; blank lines and # comments skipped, as kustomize does.
    Refuses what kustomize would read differently from the eye."""
    data = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RenderError(f"{kfile}: {e}") from e
    for number, line in enumerate(lines, 1):
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{path}:{number}"
        if "=" not in stripped:
            raise RenderError(f"{where}: not KEY=VALUE (kustomize would read the value "
                              "from its own environment)")
        key, value = stripped.split("=", 1)
        _add_entry(data, key, value, where)
    return data


def _add_entry(data, key, value, where):
    if not key or not all(c.isalnum() or c in "-_." for c in key):
        raise RenderError(f"{where}: invalid key {key!r}")
    if value != value.rstrip() or value[:1] in ("'", '"'):
        raise RenderError(f"{where}: value of {key} has quotes or trailing blanks, which "
                          "kustomize keeps or strips differently; write it bare")
    if key in data:
        raise RenderError(f"{where}: key {key} given twice")
    data[key] = value


def _generate(kind, spec, root, kfile):
    """The ConfigMap or Secret one generator entry makes."""
    field = "configMapGenerator" if kind == "ConfigMap" else "secretGenerator"
    where = f"{kfile}: {field}"
    _check_fields(spec, GENERATOR_FIELDS[field], where)
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise RenderError(f"{where}: entry without name")
    data = {}
    for env in spec.get("envs", []):
        for key, value in _parse_env_file(_inside(root, env, "envs file", kfile), kfile).items():
            _add_entry(data, key, value, f"{where} {name}")
    for literal in spec.get("literals", []):
        if not isinstance(literal, str) or "=" not in literal:
            raise RenderError(f"{where} {name}: literal {literal!r} is not KEY=VALUE")
        key, value = literal.split("=", 1)
        _add_entry(data, key, value, f"{where} {name}")
    for entry in spec.get("files", []):
        key, _, relative = entry.rpartition("=") if "=" in entry else ("", "", entry)
        path = _inside(root, relative, "file", kfile)
        key = key or os.path.basename(relative)
        try:
            with open(path, "rb") as f:
                contents = f.read()
        except OSError as e:
            raise RenderError(f"{where} {name}: {e}") from e
        if key in data:
            raise RenderError(f"{where} {name}: key {key} given twice")
        data[key] = contents
    obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}
    if kind == "ConfigMap":
        obj["data"] = data
    else:
        obj["type"] = spec.get("type", "Opaque")
        obj["data"] = {
            k: base64.b64encode(v if isinstance(v, bytes) else v.encode()).decode()
            for k, v in data.items()
        }
    return obj


def strategic_merge(target, patch, path=()):
    """`patch` merged into `target` (both JSON-like), as kustomize's strategic
    merge does for the fields described in the module's docstring."""
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    result = dict(target)
    for key, value in patch.items():
        here = path + (key,)
        if isinstance(key, str) and key.startswith("$"):
            raise RenderError(f"patch directive {key!r} at {'.'.join(map(str, here))} is not "
                              "supported")
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value, here)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = strategic_merge(result[key], value, here)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(field, original, patch, path):
    where = ".".join(map(str, path))
    objects = [e for e in patch if isinstance(e, dict)]
    if not objects:
        if field == "finalizers":
            raise RenderError(f"patching {where}: merged lists of scalars are not supported")
        return copy.deepcopy(patch)
    if len(objects) != len(patch):
        raise RenderError(f"patching {where}: a list mixing objects and scalars")
    merge_key = MERGE_KEYS.get(field)
    if merge_key is None:
        if field in REPLACED_OBJECT_LISTS:
            return copy.deepcopy(patch)
        raise RenderError(
            f"patching {where}: render.py does not know how kustomize merges the list "
            f"{field!r}; add it to MERGE_KEYS or REPLACED_OBJECT_LISTS after checking "
            "against kubectl kustomize")
    if not isinstance(original, list):
        original = []
    by_key = {}
    for element in original:
        if isinstance(element, dict) and merge_key in element:
            by_key[element[merge_key]] = element
    merged, seen = [], set()
    for element in patch:
        if merge_key not in element:
            raise RenderError(f"patching {where}: element without its merge key {merge_key}")
        k = element[merge_key]
        if k in seen:
            raise RenderError(f"patching {where}: {merge_key} {k!r} twice")
        seen.add(k)
        merged.append(strategic_merge(by_key[k], element, path + (k,)) if k in by_key
                      else strategic_merge({}, element, path + (k,)))
    merged.extend(copy.deepcopy(e) for e in original
                  if not (isinstance(e, dict) and e.get(merge_key) in seen))
    return merged


def _split_image(image):
    """(name, suffix): suffix is ':tag', '@digest' or ''."""
    at = image.find("@")
    if at >= 0:
        return image[:at], image[at:]
    colon = image.rfind(":")
    if colon > image.rfind("/"):
        return image[:colon], image[colon:]
    return image, ""


def _containers(obj):
    """Every container and init container of a Pod or a workload's template."""
    spec = obj.get("spec") or {}
    pod_specs = [spec.get("template", {}).get("spec")] if "template" in spec else [spec]
    if obj.get("kind") == "JobSet":  # each replicated Job's pod template
        pod_specs = [(((j or {}).get("template") or {}).get("spec") or {}).get("template", {}).get("spec")
                     for j in spec.get("replicatedJobs") or []]
    for pod in pod_specs:
        if not isinstance(pod, dict):
            continue
        for field in ("initContainers", "containers"):
            for c in pod.get(field) or []:
                if isinstance(c, dict):
                    yield c


def _apply_images(resources, images, kfile):
    for entry in images:
        _check_fields(entry, IMAGE_FIELDS, f"{kfile}: images")
        if not isinstance(entry.get("name"), str):
            raise RenderError(f"{kfile}: images entry without name")
        matched = False
        for resource in resources:
            for container in _containers(resource.obj):
                image = container.get("image")
                if not isinstance(image, str):
                    continue
                name, suffix = _split_image(image)
                if name != entry["name"]:
                    continue
                matched = True
                if "newName" in entry:
                    name = entry["newName"]
                if "newTag" in entry:
                    suffix = ":" + str(entry["newTag"])
                container["image"] = name + suffix
        if not matched:
            raise RenderError(f"{kfile}: images entry {entry['name']!r} matches no container "
                              "image (kustomize would ignore it silently)")


def _build(directory, stack):
    directory = os.path.normpath(directory)
    real = os.path.realpath(directory)
    if real in stack:
        raise RenderError(f"{directory}: kustomization cycle")
    kfile = _kustomization_file(directory)
    docs = load_documents(kfile)
    if len(docs) != 1:
        raise RenderError(f"{kfile}: expected one YAML document")
    k = docs[0]
    _check_fields(k, KUSTOMIZATION_FIELDS, kfile)
    if k.get("kind", "Kustomization") != "Kustomization":
        raise RenderError(f"{kfile}: kind {k['kind']!r} is not supported")

    # 1. Resources, in order: files and nested kustomizations.
    resources = []
    for entry in k.get("resources", []):
        path = os.path.normpath(os.path.join(directory, entry))
        if os.path.isdir(path):
            resources.extend(_build(path, stack | {real}))
            continue
        path = _inside(directory, entry, "resource", kfile)
        for index, obj in enumerate(load_documents(path)):
            where = f"{path} (document {index + 1})"
            _check_resource(obj, where)
            resources.append(Resource(obj, where))

    # 2. Generators: new ConfigMaps and Secrets, or merged into a base's.
    options = k.get("generatorOptions")
    if k.get("configMapGenerator") or k.get("secretGenerator"):
        if options != {"disableNameSuffixHash": True}:
            raise RenderError(
                f"{kfile}: generators need generatorOptions: {{disableNameSuffixHash: true}} "
                "(render.py does not compute kustomize's name hashes)")
    elif options is not None:
        _check_fields(options, {"disableNameSuffixHash"}, f"{kfile}: generatorOptions")
    for field, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
        for spec in k.get(field, []):
            generated = _generate(kind, spec, directory, kfile)
            behavior = spec.get("behavior", "create")
            existing = [r for r in resources if r.kind == kind and r.name == generated["metadata"]["name"]]
            if behavior == "create":
                if existing:
                    raise RenderError(f"{kfile}: {field} {generated['metadata']['name']} already "
                                      "exists (use behavior: merge)")
                resources.append(Resource(generated, f"{kfile} ({field})"))
            elif behavior == "merge":
                if not existing:
                    raise RenderError(f"{kfile}: {field} {generated['metadata']['name']} with "
                                      f"behavior merge: no such {kind} in the resources")
                existing[0].obj.setdefault("data", {}).update(generated["data"])
                existing[0].patches.append((f"{kfile} ({field})", {"data": generated["data"]}))
            else:
                raise RenderError(f"{kfile}: {field} behavior {behavior!r} is not supported")

    seen = set()
    for resource in resources:
        if resource.key() in seen:
            raise RenderError(f"{kfile}: {resource.describe()} is defined twice")
        seen.add(resource.key())

    # 3. Patches, then images (kustomize's order of its built-in transformers).
    for entry in k.get("patches", []):
        _check_fields(entry, PATCH_FIELDS, f"{kfile}: patches")
        if "path" in entry:
            source = _inside(directory, entry["path"], "patch", kfile)
            patch_docs = load_documents(source)
        elif "patch" in entry:
            source = f"{kfile} (inline patch)"
            try:
                patch_docs = [d for d in yaml.load_all(entry["patch"], Loader=_StrictLoader) if d]
            except yaml.YAMLError as e:
                raise RenderError(f"{source}: {e}") from e
        else:
            raise RenderError(f"{kfile}: a patch needs path or patch")
        for patch in patch_docs:
            _check_resource(patch, source)
            matches = [r for r in resources if r.key() == (patch["apiVersion"], patch["kind"],
                                                         patch["metadata"]["name"])]
            if not matches:
                raise RenderError(f"{source}: patch target {patch['kind']}/"
                                  f"{patch['metadata']['name']} is not among the resources")
            try:
                matches[0].obj = strategic_merge(matches[0].obj, patch)
            except RenderError as e:
                raise RenderError(f"{source}: {e}") from e
            matches[0].patches.append((source, patch))
    _apply_images(resources, k.get("images", []), kfile)
    return resources


def render(directory):
    """The resources of the kustomization in `directory`, in kustomize's
    output order. Raises RenderError."""
    resources = _build(directory, frozenset())

    def order(r):
        kind = r.kind
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        return (rank, kind, r.name)

    return sorted(resources, key=order)


def main(argv):
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        resources = render(argv[1])
    except RenderError as e:
        print(f"render.py: {e}", file=sys.stderr)
        return 1
    yaml.safe_dump_all([r.obj for r in resources], sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
