"""containers/slinky/: every manifest is valid as the API server and the operator would take it (issue 11).

- Slinky's kinds (NodeSet, Controller, Accounting, LoginSet) against the operator's CRD schemas (read
  from ../shared/slinky/crds, or $SLURM_EXT_SLINKY_CRDS), with unknown fields rejected: the API server
  would prune them, so a typo'd key would silently do nothing.
- Their container fields (`slurmd`, `slurmctld`, `slurmdbd`, `login`) and `template.spec`, which the
  CRDs leave open (x-kubernetes-preserve-unknown-fields) and the operator decodes as a corev1
  Container and PodSpec (dropping what it does not know), strictly as a Pod's, with kubernetes-validate.
- Built-in kinds (ConfigMap, Secret, Service, StatefulSet) strictly with kubernetes-validate.
- slurm-ext's config in the ConfigMap with slurm-ext's own validation.
"""

from __future__ import annotations

import copy
import os
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from slurm_ext import config
from slurm_ext.supervisor.slurmd_args import CONFIGLESS_GRES

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "containers" / "slinky"
KUBERNETES = "1.33.0"
#: the CRDs' container fields: the operator names the container after them
CONTAINER_FIELDS = ("slurmd", "slurmctld", "slurmdbd", "login")


def _crd_dir() -> Path:
    found = Path(os.environ.get("SLURM_EXT_SLINKY_CRDS") or REPO.parent / "shared" / "slinky" / "crds")
    assert found.is_dir(), (f"Slinky's CRD schemas are not at {found}: set SLURM_EXT_SLINKY_CRDS to the directory "
                            "of SlinkyProject/slurm-operator's config/crd/bases/*.yaml")
    return found


def _strict(schema: dict) -> dict:
    """`schema` with additionalProperties: false wherever it lists properties and keeps no unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields") \
                    and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@pytest.fixture(scope="module")
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> its strict openAPIV3Schema."""
    schemas = {}
    for path in sorted(_crd_dir().glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served"):
                    schemas[(f"{group}/{version['name']}", kind)] = _strict(version["schema"]["openAPIV3Schema"])
    assert {kind for _, kind in schemas} >= {"NodeSet", "Controller", "Accounting", "LoginSet"}, schemas.keys()
    return schemas


def validate(doc: dict, crd_schemas: dict) -> None:
    """Raise (jsonschema or kubernetes-validate's ValidationError) unless `doc` is valid as described above."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in crd_schemas:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        return
    jsonschema.validate(doc, crd_schemas[key])
    spec = doc.get("spec", {})
    for field in CONTAINER_FIELDS:
        if field in spec:
            pod_spec = {**spec.get("template", {}).get("spec", {}), "containers": [{"name": field, **spec.get(field, {})}]}
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": doc["metadata"]["name"]},
                                          "spec": pod_spec}, KUBERNETES, strict=True)


def _documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs += [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
                 for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def _doc(kind: str, name: str | None = None) -> dict:
    """The manifest of `kind` named `name` (None: the first of that kind)."""
    found = [doc for _, doc in _documents() if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert found and (name is None or len(found) == 1), (kind, name, len(found))
    return copy.deepcopy(found[0])


def test_the_manifests_hold_every_kind_a_deployment_needs():
    kinds = sorted({doc["kind"] for _, doc in _documents()})
    assert kinds == ["Accounting", "ConfigMap", "Controller", "LoginSet", "NodeSet", "Secret", "Service",
                     "StatefulSet"], kinds


@pytest.mark.parametrize("name, doc", _documents(), ids=[name for name, _ in _documents()])
def test_every_manifest_is_valid(name, doc, crd_schemas):
    validate(doc, crd_schemas)


def _typo(kind: str, path: tuple, wrong: str) -> dict:
    """The `kind` manifest with the key at `path` (a tuple of keys) renamed to `wrong`."""
    doc = _doc(kind)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[wrong] = parent.pop(path[-1])
    return doc


@pytest.mark.parametrize("kind, path, wrong", [
    ("NodeSet", ("spec", "replicas"), "replica"),  # the CRD's own field
    ("NodeSet", ("spec", "updateStrategy", "rollingUpdate", "maxUnavailable"), "maxUnavailabe"),
    ("NodeSet", ("spec", "slurmd", "readinessProbe"), "readinesProbe"),  # the container the CRD leaves open
    ("NodeSet", ("spec", "template", "spec", "terminationGracePeriodSeconds"), "terminationGracePeriod"),
    ("Accounting", ("spec", "storageConfig", "passwordKeyRef"), "passwordRef"),
    ("Controller", ("spec", "slurmctld", "imagePullPolicy"), "pullPolicy"),
    ("StatefulSet", ("spec", "serviceName"), "servicename"),  # a built-in kind
    ("ConfigMap", ("metadata", "name"), "nme"),
])
def test_a_typo_is_rejected(kind, path, wrong, crd_schemas):
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(_typo(kind, path, wrong), crd_schemas)


def test_the_slurm_ext_config_in_the_configmap_is_valid_and_the_probes_ask_the_agent():
    configmap = _doc("ConfigMap", "slurm-ext-worker")
    loaded = config.from_dict(tomllib.loads(configmap["data"]["slurm-ext.toml"]), "slinky ConfigMap")
    nodeset = _doc("NodeSet")
    slurmd = nodeset["spec"]["slurmd"]
    [port] = [p["containerPort"] for p in slurmd["ports"] if p["name"] == "agent"]
    assert port == loaded.supervisor.port("worker")
    assert slurmd["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "agent"}
    assert slurmd["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "agent"}
    pod = nodeset["spec"]["template"]["spec"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
    # the agent stops slurmd and the hook service one after the other, each within its stop_grace
    from slurm_ext.supervisor.workers import workers_for
    graces = sum(worker.stop_grace for worker in workers_for("worker", loaded.supervisor))
    assert pod["terminationGracePeriodSeconds"] > graces, (pod["terminationGracePeriodSeconds"], graces)


def test_the_controllers_gres_conf_includes_the_file_the_worker_agent_writes():
    """Configless slurmd reads gres.conf only from slurmctld: the Include is how each node's File= from NVML
    reaches it (proven on a cluster in test_container_cluster.py)."""
    controller = _doc("Controller")
    assert {"name": "slurm-ext-gres"} in controller["spec"]["configFileRefs"]
    gres = _doc("ConfigMap", "slurm-ext-gres")["data"]["gres.conf"]
    assert f"Include {CONFIGLESS_GRES}" in gres.splitlines()
    assert "Prolog=/usr/local/libexec/slurm-ext/slurm-ext-hook" in controller["spec"]["extraConf"].splitlines()

