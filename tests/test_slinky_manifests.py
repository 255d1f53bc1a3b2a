"""containers/slinky/: every manifest is valid as the API server and the operator would take it (issue 11).

- Slinky's kinds (NodeSet, Controller, Accounting, LoginSet) against the operator's CRD schemas (read
  from tests/data/slinky/crds, or $SLURM_EXT_SLINKY_CRDS), with unknown fields rejected: the API server
  would prune them, so a typo'd key would silently do nothing.
- Their container fields (`slurmd`, `slurmctld`, `slurmdbd`, `login`) and `template.spec`, which the
  CRDs leave open (x-kubernetes-preserve-unknown-fields) and the operator decodes as a corev1
  Container and PodSpec (dropping what it does not know), strictly as a Pod's, with kubernetes-validate.
- Built-in kinds (ConfigMap, Secret, Service, StatefulSet, StorageClass, PersistentVolumeClaim, CronJob)
  strictly with kubernetes-validate.
- slurm-ext's config in the ConfigMaps with slurm-ext's own validation.
- Durable accounting: the database on a Retain volume that outlives its pod and claim, the
  password only as a mounted Secret file that a reinstall keeps, slurmdbd pointed at the database's
  Service, StateSaveLocation and the job-end witness on the Controller's claim, daily backups on a claim
  of their own.
- No secret value in any manifest; create-secrets.sh, run for real with a kubectl stand-in, makes every
  Secret they name with values slurm-ext's checks take, and the agents refuse guessable ones at start
  (issue 28, item 3).
- The NetworkPolicies, judged by label matching as a NetworkPolicy implementation does: agents' ports
  from the controller (and the pod's node) only, MariaDB from slurmdbd, the controller and the backup
  Job only (item 7).
- The repair executor's RBAC is what it calls, and the ValidatingAdmissionPolicy's CEL, run by
  cel-python on real Node objects, admits only a cordon and the RMA label (item 21).
"""

from __future__ import annotations

import copy
import ipaddress
import os
import subprocess
import tomllib
from dataclasses import dataclass
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
    found = Path(os.environ.get("SLURM_EXT_SLINKY_CRDS") or REPO / "tests" / "data" / "slinky" / "crds")
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
            pod_spec = {**spec.get("template", {}).get("spec", {}),
                        "containers": [{"name": field, **spec.get(field, {})}]}
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": doc["metadata"]["name"]}, "spec": pod_spec}
            kubernetes_validate.validate(pod, KUBERNETES, strict=True)


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
    assert kinds == ["Accounting", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Controller", "CronJob",
                     "LoginSet", "NetworkPolicy", "NodeSet", "PersistentVolumeClaim", "Role", "RoleBinding", "Service",
                     "ServiceAccount", "StatefulSet", "StorageClass", "ValidatingAdmissionPolicy",
                     "ValidatingAdmissionPolicyBinding"], kinds


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
    ("Controller", ("spec", "persistence", "enabled"), "enable"),
    ("StatefulSet", ("spec", "persistentVolumeClaimRetentionPolicy", "whenDeleted"), "whenDelete"),
    ("StorageClass", ("reclaimPolicy",), "reclaimpolicy"),
    ("PersistentVolumeClaim", ("spec", "accessModes"), "accessMode"),
    ("CronJob", ("spec", "concurrencyPolicy"), "concurrency"),
    ("CronJob", ("spec", "jobTemplate", "spec", "backoffLimit"), "backofflimit"),
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



# -- durable accounting -------------------------------------------------------------------

#: the operator's StateSaveLocation is <this>/<clusterName>, and the Controller's persistence claim is
#: mounted there (slurm-operator v1.2.1, controllerbuilder: clusterSpoolDir)
OPERATOR_SPOOL = "/var/spool/slurmctld"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _pod_specs() -> list[tuple[str, dict]]:
    """Every pod spec of a built-in workload: (its manifest's name, the PodSpec)."""
    pods = []
    for name, doc in _documents():
        if doc["kind"] == "StatefulSet":
            pods.append((name, doc["spec"]["template"]["spec"]))
        elif doc["kind"] == "CronJob":
            pods.append((name, doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
    assert pods
    return pods


def _containers(pod: dict) -> list[dict]:
    return pod.get("initContainers", []) + pod["containers"]


def _container(pod: dict, name: str) -> dict:
    [found] = [c for c in _containers(pod) if c["name"] == name]
    return found


def _volume_at(pod: dict, container: dict, path: str) -> tuple[dict, dict]:
    """(volumeMount, volume) of `container` mounted exactly at `path`."""
    [mount] = [m for m in container.get("volumeMounts", []) if m["mountPath"] == path]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def _agent_config(pod: dict, container: dict) -> config.Config:
    """The slurm-ext config `container` runs with: $SLURM_EXT_CONFIG in a mounted ConfigMap, validated."""
    [path] = [e["value"] for e in container.get("env", []) if e["name"] == config.ENV_VAR]
    mount, volume = _volume_at(pod, container, str(Path(path).parent))
    assert mount.get("readOnly") is True
    [source] = ([volume["configMap"]] if "configMap" in volume else
                [s["configMap"] for s in volume["projected"]["sources"] if "configMap" in s])
    configmap = _doc("ConfigMap", source["name"])
    return config.from_dict(tomllib.loads(configmap["data"][Path(path).name]),
                            f"ConfigMap {configmap['metadata']['name']}")


def _mib(quantity: str) -> int:
    units = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    return int(quantity[:-2]) * units[quantity[-2:]]


def _mariadb() -> tuple[dict, dict, dict]:
    """The mariadb StatefulSet, its pod spec and its container."""
    statefulset = _doc("StatefulSet", "mariadb")
    pod = statefulset["spec"]["template"]["spec"]
    return statefulset, pod, _container(pod, "mariadb")


def _storage_class(name: str) -> dict:
    return _doc("StorageClass", name)


def _assert_retained(claim_spec: dict, what: str) -> None:
    assert claim_spec["accessModes"] == ["ReadWriteOnce"], what
    storage_class = _storage_class(claim_spec["storageClassName"])
    assert storage_class["reclaimPolicy"] == "Retain", what
    assert storage_class["allowVolumeExpansion"] is True, what


def test_every_claim_is_retained_on_the_retain_storage_class():
    """A deleted claim must leave its disk behind: the default reclaimPolicy, Delete, takes the data with it."""
    statefulset, _, _ = _mariadb()
    [template] = statefulset["spec"]["volumeClaimTemplates"]
    _assert_retained(template["spec"], "mariadb's volumeClaimTemplate")
    _assert_retained(_doc("Controller")["spec"]["persistence"], "the Controller's persistence")
    for name, doc in _documents():
        if doc["kind"] == "PersistentVolumeClaim":
            _assert_retained(doc["spec"], name)
            assert doc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", name
    assert _storage_class("slurm-ext-retain")["volumeBindingMode"] == "WaitForFirstConsumer"


def test_the_database_lives_on_a_claim_that_outlives_the_statefulset():
    statefulset, pod, mariadb = _mariadb()
    spec = statefulset["spec"]
    assert spec["replicas"] == 1
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    [template] = spec["volumeClaimTemplates"]
    assert template["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert _storage_class(template["spec"]["storageClassName"])["reclaimPolicy"] == "Retain"
    # the claim is mounted where the agent keeps datadir, tmpdir, logs and the identity marker
    loaded = _agent_config(pod, mariadb)
    assert loaded.accounting.run_database is True
    [mount] = [m for m in mariadb["volumeMounts"] if m["name"] == template["metadata"]["name"]]
    assert mount["mountPath"] == loaded.accounting.volume and not mount.get("readOnly")
    assert template["metadata"]["name"] not in {v["name"] for v in pod.get("volumes", [])}  # no emptyDir shadow
    from slurm_ext.accounting import places_of
    where = places_of(loaded)
    for path in (where.datadir, where.tmpdir, where.logdir, where.marker):
        assert path.is_relative_to(loaded.accounting.volume), path


def test_the_mariadb_agent_runs_only_the_database_and_the_kubelet_can_probe_it():
    statefulset, pod, mariadb = _mariadb()
    assert mariadb["image"] == "slurm-ext-mariadb:sid" and "command" not in mariadb  # the agent, as built
    loaded = _agent_config(pod, mariadb)
    from slurm_ext.accounting import places_of
    from slurm_ext.accounting.plugin import local_database
    from slurm_ext.supervisor.workers import workers_for
    where = places_of(loaded)
    workers = workers_for("accounting", loaded.supervisor,
                          changes=local_database(str(where.etc / "my.cnf"), str(where.etc / "init.sql")))
    assert [w.name for w in workers] == ["mariadbd"]  # slurmdbd is the Accounting resource's pod
    # InnoDB's clean shutdown gets its stop_grace before the kubelet's SIGKILL
    assert pod["terminationGracePeriodSeconds"] > sum(w.stop_grace for w in workers)
    # the database listens for other pods, on the port the Service targets
    assert loaded.accounting.db_listen not in LOOPBACK
    ports = {p["name"]: p["containerPort"] for p in mariadb["ports"]}
    assert ports["mysql"] == loaded.accounting.db_port
    assert ports["agent"] == loaded.supervisor.port("accounting") == 9812
    assert mariadb["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "agent"}
    assert mariadb["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "agent"}
    # the buffer pool is sized from the memory the container really has
    limit = _mib(mariadb["resources"]["limits"]["memory"])
    assert loaded.accounting.memory == limit
    assert _mib(mariadb["resources"]["requests"]["memory"]) == limit
    assert loaded.accounting.cluster == _doc("Controller")["spec"]["clusterName"]


def test_every_agent_listens_where_the_kubelet_probes():
    """httpGet probes go to the pod's IP: an agent on 127.0.0.1 (the default) would fail every one."""
    targets = [(pod, c) for _, pod in _pod_specs() for c in _containers(pod)]
    nodeset = _doc("NodeSet")["spec"]
    targets.append((nodeset["template"]["spec"], nodeset["slurmd"]))
    probed = 0
    for pod, container in targets:
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container.get(kind, {}).get("httpGet")
            if probe is None:
                continue
            loaded = _agent_config(pod, container)
            assert probe["port"] == "agent" and ports["agent"] in loaded.supervisor.ports.values()
            assert loaded.supervisor.listen not in LOOPBACK, container["name"]
            probed += 1
    assert probed == 6  # the NodeSet's and mariadb's three each


#: the workloads that run a slurm-ext agent (kind, name, its container field or container name)
_AGENTS = (("NodeSet", "gpu", "slurmd"), ("Controller", "slurm", "slurmctld"), ("Accounting", "slurm", "slurmdbd"),
           ("LoginSet", "login", "login"), ("StatefulSet", "mariadb", "mariadb"))


def _agent_pod(kind: str, name: str, field: str) -> tuple[dict, dict]:
    """(pod spec, container) of a workload that runs an agent: a Slinky kind's container field and template."""
    doc = _doc(kind, name)
    if kind == "StatefulSet":
        pod = doc["spec"]["template"]["spec"]
        return pod, _container(pod, field)
    return doc["spec"].get("template", {}).get("spec", {}), doc["spec"][field]


@pytest.mark.parametrize("kind, name, field", _AGENTS)
def test_every_agent_has_the_agent_credential_as_a_root_only_file_from_one_secret(kind, name, field, created):
    """The agents' journal and health answer only the credential, and the controller believes only answers signed
    with it: every pod with an agent has it where its config says (the default, /etc/slurm-ext/agent-credential),
    0400, from the one Secret (issue 27)."""
    pod, container = _agent_pod(kind, name, field)
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    loaded = _agent_config(pod, container) if config.ENV_VAR in env else config.from_dict({})
    path = Path(loaded.node.agent_credential)
    assert str(path) == "/etc/slurm-ext/agent-credential"
    mount, volume = _volume_at(pod, container, str(path.parent))
    assert mount["readOnly"] is True
    if "secret" in volume:
        assert volume["secret"]["secretName"] == "slurm-ext-agent-credential"
        assert volume["secret"]["defaultMode"] == 0o400 and "items" not in volume["secret"]
    else:
        [secret] = [s["secret"] for s in volume["projected"]["sources"] if "secret" in s]
        assert secret["name"] == "slurm-ext-agent-credential"
        assert secret["items"] == [{"key": "agent-credential", "path": path.name, "mode": 0o400}]
    assert path.name in created.secrets["slurm-ext-agent-credential"]


def _password_secret() -> tuple[str, str]:
    ref = _doc("Accounting")["spec"]["storageConfig"]["passwordKeyRef"]
    return ref["name"], ref["key"]


#: the password files of each workload's agent config, and the Secret's key each is: slurmdbd's own password
#: (`password`) only in the database's pod; the others only in the pods of the part that connects with them
_PASSWORD_FILES = {
    ("StatefulSet", "mariadb", "mariadb"): {"password_file": "password", "repair_password_file": "repair-password",
                                            "page_password_file": "page-password",
                                            "backup_password_file": "backup-password"},
    ("CronJob", "slurm-accounting-backup", "backup"): {"password_file": "backup-password"},
    ("Controller", "slurm", "slurmctld"): {"repair_password_file": "repair-password",
                                           "page_password_file": "page-password"},
}


def _workload_pod(kind: str, name: str, field: str) -> tuple[dict, dict]:
    if kind == "CronJob":
        pod = _doc(kind, name)["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return pod, _container(pod, field)
    return _agent_pod(kind, name, field)


def _secret_keys_at(volume: dict, secret_name: str) -> set[str]:
    """The keys of Secret `secret_name` a secret volume shows (all of them, when it lists no items)."""
    assert volume["secret"]["secretName"] == secret_name
    items = volume["secret"].get("items")
    if items is None:
        return {"password", "repair-password", "page-password", "backup-password"}
    assert all(item["key"] == item["path"] for item in items), items
    return {item["key"] for item in items}


@pytest.mark.parametrize("kind, name, field", _PASSWORD_FILES, ids=[name for _, name, _ in _PASSWORD_FILES])
def test_each_database_password_is_only_a_mounted_secret_file_where_its_part_runs(kind, name, field):
    """Each part connects as its own account (accounting.accounts), with its password as a root-only file of the
    one Secret: the backup Job and the controller never see slurmdbd's password (issue 28, item 7)."""
    pod, container = _workload_pod(kind, name, field)
    loaded = _agent_config(pod, container)
    secret_name, slurmdbd_key = _password_secret()
    wanted = _PASSWORD_FILES[(kind, name, field)]
    for setting in ("password_file", "repair_password_file", "page_password_file", "backup_password_file"):
        path = getattr(loaded.accounting, setting)
        assert bool(path) == (setting in wanted), (name, setting, path)
        if not path:
            continue
        mount, volume = _volume_at(pod, container, str(Path(path).parent))
        assert Path(path).name == wanted[setting] in _secret_keys_at(volume, secret_name)
        assert mount["readOnly"] is True and volume["secret"]["defaultMode"] == 0o400
    shown = {key for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret_name
             for key in _secret_keys_at(v, secret_name)}
    assert shown == set(wanted.values()), (name, shown)
    assert (slurmdbd_key in shown) == (name == "mariadb")
    if name == "slurm-accounting-backup":  # it connects as backups' read-only account
        assert loaded.accounting.db_user == "slurm_ext_backup"


@pytest.mark.parametrize("name, pod", _pod_specs(), ids=[name for name, _ in _pod_specs()])
def test_no_pod_holds_the_password_in_its_environment_or_command_line(name, pod):
    from slurm_ext.accounting import PASSWORD_ENV
    for container in _containers(pod):
        assert "envFrom" not in container, name
        for env in container.get("env", []):
            assert "valueFrom" not in env and env["name"] != PASSWORD_ENV, (name, env)
        words = " ".join(container.get("command", []) + container.get("args", []))
        assert "password" not in words.lower(), (name, words)


def test_the_password_secret_survives_reinstalls(created):
    """Slinky issue 44: a password regenerated at reinstall no longer opens the database kept on the volume. No
    manifest holds it (a re-applied one would set it back), and create-secrets.sh marks it to be kept."""
    secret_name, key = _password_secret()
    assert key in created.secrets[secret_name]
    assert created.annotations[secret_name] == {"helm.sh/resource-policy": "keep"}
    assert not [name for name, doc in _documents() if doc["kind"] == "Secret"]


def test_the_accounting_resource_points_at_the_mariadb_service():
    accounting = _doc("Accounting")["spec"]
    storage = accounting["storageConfig"]
    service = _doc("Service", storage["host"])
    statefulset, pod, mariadb = _mariadb()
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert statefulset["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    [port] = [p for p in service["spec"]["ports"] if p["port"] == storage["port"]]
    ports = {p["name"]: p["containerPort"] for p in mariadb["ports"]}
    assert ports[port["targetPort"]] == storage["port"]
    loaded = _agent_config(pod, mariadb)
    assert (storage["database"], storage["username"]) == (loaded.accounting.database, loaded.accounting.db_user)
    assert accounting["slurmdbd"]["image"] == "slurm-ext-accounting:sid"
    assert _doc("Controller")["spec"]["accountingRef"]["name"] == _doc("Accounting")["metadata"]["name"]
    # slurmdbd stops within its stop_grace, before the kubelet's SIGKILL
    from slurm_ext.supervisor.workers import workers_for
    graces = sum(w.stop_grace for w in workers_for("accounting", config.from_dict({}, "defaults").supervisor))
    assert accounting["template"]["spec"]["terminationGracePeriodSeconds"] > graces


def test_the_controller_keeps_state_save_location_and_the_job_end_witness_on_its_claim():
    controller = _doc("Controller")["spec"]
    persistence = controller["persistence"]
    assert persistence["enabled"] is True and "existingClaim" not in persistence
    assert persistence["accessModes"] == ["ReadWriteOnce"]
    state_save = f"{OPERATOR_SPOOL}/{controller['clusterName']}"
    conf = dict(line.split("=", 1) for line in controller["extraConf"].splitlines() if "=" in line)
    assert "StateSaveLocation" not in conf  # the operator's, where the claim is mounted
    assert conf["JobCompType"] == "jobcomp/filetxt"
    assert Path(conf["JobCompLoc"]).parent == Path(state_save)
    # dbd.messages is written at a clean stop only: the kubelet waits longer than the agent lets slurmctld take
    defaults = config.from_dict({}, "defaults")
    assert controller["template"]["spec"]["terminationGracePeriodSeconds"] > defaults.accounting.stop_deadline


def test_the_backup_cronjob_writes_to_its_own_claim():
    cronjob = _doc("CronJob", "slurm-accounting-backup")
    spec = cronjob["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert 1 <= spec["successfulJobsHistoryLimit"] <= 5 and 1 <= spec["failedJobsHistoryLimit"] <= 5
    job = spec["jobTemplate"]["spec"]
    assert 0 < job["backoffLimit"] <= 5 and job["activeDeadlineSeconds"] > 0
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    backup = _container(pod, "backup")
    assert backup["image"] == "slurm-ext-mariadb:sid"
    assert backup["command"][:4] == ["slurm-ext", "accounting", "backup", "--to"]
    target = backup["command"][4]
    mount, volume = _volume_at(pod, backup, target)
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert claim == "slurm-accounting-backups" and not mount.get("readOnly")
    _assert_retained(_doc("PersistentVolumeClaim", claim)["spec"], claim)
    # its own: neither the database's claim nor mounted by any other workload
    statefulset, _, _ = _mariadb()
    assert claim not in {f"{t['metadata']['name']}-mariadb-0" for t in statefulset["spec"]["volumeClaimTemplates"]}
    others = [name for name, other in _pod_specs() if not name.endswith(f"CronJob/{cronjob['metadata']['name']}")
              for v in other.get("volumes", []) if v.get("persistentVolumeClaim", {}).get("claimName") == claim]
    assert others == []
    loaded = _agent_config(pod, backup)
    service = _doc("Service", loaded.accounting.db_host)
    assert loaded.accounting.db_port in {p["port"] for p in service["spec"]["ports"]}
    assert loaded.accounting.cluster == _doc("Controller")["spec"]["clusterName"]
    assert loaded.accounting.backup_dir == target and loaded.accounting.backup_keep == 14
    # then the newest backup is restored into a scratch MariaDB (the same image) and checked
    [verify] = pod["containers"]
    assert verify["image"] == backup["image"]
    assert "slurm-ext accounting verify" in " ".join(verify["command"])
    assert _volume_at(pod, verify, target)[0]["readOnly"] is True
    # both sign and check manifests with the backup key (issue 28, item 1): a Secret of its own, root's, 0400, off
    # the backups claim
    for container in (backup, verify):
        key = _agent_config(pod, container).accounting.backup_key
        key_mount, key_volume = _volume_at(pod, container, str(Path(key).parent))
        assert key_volume["secret"]["secretName"] == "slurm-accounting-backup-key"
        assert key_volume["secret"]["defaultMode"] == 0o400 and key_mount["readOnly"] is True
        assert not Path(key).is_relative_to(target)


# -- no secret values shipped, and guessable ones refused at start (issue 28, item 3) ------------------------

#: the slurm.key the manifests once shipped (37 bytes): a deployment applied as it was ran on it
SHIPPED_KEY = b"REPLACE-ME-with-1-KiB-of-random-bytes"
CREATE_SECRETS = MANIFESTS / "create-secrets.sh"

#: a stand-in for kubectl, which needs a cluster: it keeps what `create secret generic NAME --from-file=KEY=FILE`
#: and `annotate secret NAME K=V` would store, under $KUBECTL_RECORD, and every command line it was given
_KUBECTL = r'''#!{python}
import json, os, shutil, sys
record = os.environ["KUBECTL_RECORD"]
with open(os.path.join(record, "argv"), "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
assert args[0] == "-n", args
namespace, verb = args[1], args[2:]
if verb[:3] == ["create", "secret", "generic"]:
    target = os.path.join(record, namespace, "secrets", verb[3])
    os.makedirs(target)  # exists already: kubectl refuses to create a Secret twice
    for option in verb[4:]:
        key, source = option.removeprefix("--from-file=").split("=", 1)
        shutil.copyfile(source, os.path.join(target, key))
elif verb[:2] == ["annotate", "secret"]:
    with open(os.path.join(record, namespace, "annotations-" + verb[2]), "a") as out:
        out.write(verb[3] + "\n")
else:
    sys.exit("kubectl stand-in: unexpected command " + " ".join(args))
'''


class CreatedSecrets:
    """What create-secrets.sh made: Secret -> {key: value}, Secret -> annotations, and every kubectl command line."""

    def __init__(self, record: Path, namespace: str):
        root = record / namespace
        self.secrets = {d.name: {f.name: f.read_bytes() for f in d.iterdir()} for d in (root / "secrets").iterdir()}
        self.annotations = {p.name.removeprefix("annotations-"): dict(line.split("=", 1) for line in
                                                                      p.read_text().splitlines())
                            for p in root.glob("annotations-*")}
        self.argv = (record / "argv").read_text()


@pytest.fixture(scope="module")
def created(tmp_path_factory) -> CreatedSecrets:
    """create-secrets.sh, run for real (sh, od, head, mktemp) with the kubectl stand-in."""
    import subprocess
    import sys
    work = tmp_path_factory.mktemp("create-secrets")
    bin_dir, record = work / "bin", work / "record"
    bin_dir.mkdir()
    record.mkdir()
    (bin_dir / "kubectl").write_text(_KUBECTL.replace("{python}", sys.executable))
    (bin_dir / "kubectl").chmod(0o755)
    sssd = work / "sssd.conf"
    sssd.write_text("[sssd]\nservices = nss, pam\ndomains = example.org\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KUBECTL_RECORD": str(record)}
    done = subprocess.run(["sh", str(CREATE_SECRETS), "slurm", str(sssd)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    # a second run must not replace what the first made (a database keeps its password)
    again = subprocess.run(["sh", str(CREATE_SECRETS), "slurm", str(sssd)], env=env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode != 0
    return CreatedSecrets(record, "slurm")


def _manifest_files() -> list[Path]:
    return sorted(path for pattern in ("*.yaml", "*.yml", "*.json") for path in (REPO / "containers").rglob(pattern))


def test_no_manifest_in_containers_ships_a_secret_value():
    """A value in a shipped file is a value everybody knows: applied unchanged, the old slurm.key let anyone forge
    Slurm credentials as root on every node. No Secret anywhere under containers/ may carry data or stringData."""
    secrets = []
    for path in _manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "Secret":
                secrets.append(path.name)
                assert not doc.get("data") and not doc.get("stringData"), f"{path}: Secret with values"
    assert secrets == []
    import base64
    for path in (REPO / "containers").rglob("*"):
        if path.is_file() and path.suffix != ".whl":
            text = path.read_bytes()
            assert SHIPPED_KEY not in text and base64.b64encode(SHIPPED_KEY) not in text, path


#: the keys a pod reads of a Secret it mounts whole (no items): the files its config names there
_WHOLE_SECRETS = {"slurm-ext-agent-credential": ["agent-credential"], "slurm-accounting-backup-key": ["key"],
                  "slurm-db-password": list(_PASSWORD_FILES[("StatefulSet", "mariadb", "mariadb")].values())}


def _referenced_secrets() -> set[tuple[str, str]]:
    """(Secret, key) of every secret a manifest names: the Slinky kinds' refs and the pods' secret volumes (a
    volume without items: the keys its pod's config reads from it)."""
    found = set()
    for _, doc in _documents():
        spec = doc.get("spec", {})
        for ref in ("slurmKeyRef", "sssdConfRef"):
            if ref in spec:
                found.add((spec[ref]["name"], spec[ref]["key"]))
        if "storageConfig" in spec:
            found.add((spec["storageConfig"]["passwordKeyRef"]["name"], spec["storageConfig"]["passwordKeyRef"]["key"]))
    pods = [pod for _, pod in _pod_specs()] + [_agent_pod(kind, name, field)[0] for kind, name, field in _AGENTS]
    for pod in pods:
        for volume in pod.get("volumes", []):
            sources = volume.get("projected", {}).get("sources", [])
            for secret in [s["secret"] for s in sources if "secret" in s]:
                found |= {(secret["name"], item["key"]) for item in secret["items"]}
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                keys = ([item["key"] for item in volume["secret"]["items"]] if "items" in volume["secret"] else
                        _WHOLE_SECRETS[name])
                found |= {(name, key) for key in keys}
    return found


def test_create_secrets_makes_every_secret_the_manifests_name_with_values_every_check_accepts(created, tmp_path):
    from slurm_ext.accounting.database import password
    from slurm_ext.accounting.settings import AccountingSection
    from slurm_ext.agentapi import CredentialFile
    from slurm_ext.supervisor.preflight import key_refusal
    from slurm_ext.weaksecret import weakness
    made = {(secret, key) for secret, keys in created.secrets.items() for key in keys}
    assert _referenced_secrets() <= made, _referenced_secrets() - made
    assert ("slurm-db-password", "password") in made and ("slurm-key", "slurm.key") in made
    # the key: 1 KiB of random bytes, which the agents' preflight takes
    key = created.secrets["slurm-key"]["slurm.key"]
    assert len(key) == 1024 and len(set(key)) > 200
    (tmp_path / "etc/slurm").mkdir(parents=True)
    (tmp_path / "etc/slurm/slurm.key").write_bytes(key)
    assert key_refusal(tmp_path) is None
    # the passwords: each different, each taken by slurm-ext's checks (slurmdbd.conf has no quoting)
    passwords = created.secrets["slurm-db-password"]
    assert len(set(passwords.values())) == len(passwords) == 4
    for name, value in passwords.items():
        path = tmp_path / name
        path.write_bytes(value)
        path.chmod(0o400)
        assert password(AccountingSection(password_file=str(path)), {}) == value.decode()
        assert weakness(value, 16) is None and len(value) == 48
    # the agent credential, which the agents and the controller take
    credential = tmp_path / "agent-credential"
    credential.write_bytes(created.secrets["slurm-ext-agent-credential"]["agent-credential"])
    credential.chmod(0o400)
    assert CredentialFile(str(credential)).get().secret
    assert created.secrets["sssd-conf"]["sssd.conf"].startswith(b"[sssd]")
    # no value was on a command line, where every user of the host can read it (/proc/PID/cmdline)
    for value in [key, *passwords.values(), credential.read_bytes()]:
        assert value.decode(errors="replace") not in created.argv


@pytest.mark.parametrize("text", [SHIPPED_KEY, b"changeme" * 128, b"k" * 31 + b"\n"],
                         ids=["the key once shipped", "a placeholder", "31 bytes"])
def test_the_preflight_refuses_a_guessable_slurm_key_and_blocks_the_start(tmp_path, text):
    from slurm_ext.supervisor.pipeline import steps_for
    from slurm_ext.supervisor.preflight import key_refusal, problems
    key = tmp_path / "etc/slurm/slurm.key"
    key.parent.mkdir(parents=True)
    key.write_bytes(text)
    key.chmod(0o600)
    assert problems(tmp_path) == []  # present and private: not what the warnings are about
    refused = key_refusal(tmp_path, daemon="slurmctld")
    assert refused is not None and "/etc/slurm/slurm.key" in refused and "slurmctld is not started" in refused
    assert ("placeholder" in refused) == (text != b"k" * 31 + b"\n")
    key.write_bytes(os.urandom(1024))
    assert key_refusal(tmp_path) is None
    for role in ("worker", "controller", "accounting"):
        [preflight] = [step for step in steps_for(role) if step.name == "preflight"]
        assert preflight.on_failure == "block", role  # a refusal keeps the daemon from starting


def test_a_stale_placeholder_slurm_key_on_a_munge_site_is_a_warning_not_a_refusal(tmp_path):
    """Issue 28 review of 28.3: a munge site with an old placeholder /etc/slurm/slurm.key (unused: munge
    authenticates) had slurmd refused. The key is refused only where it is what authenticates (no munged socket,
    none run here: auth/slurm), as problems() decides for a missing key; beside munge it is a warning."""
    import socket

    from slurm_ext.supervisor.preflight import key_refusal, problems
    key = tmp_path / "etc/slurm/slurm.key"
    key.parent.mkdir(parents=True)
    key.write_bytes(SHIPPED_KEY)
    key.chmod(0o600)
    assert key_refusal(tmp_path, munged_here=True) is None  # the agent runs munged: its socket comes later
    [warning] = problems(tmp_path, munged_here=True)
    assert "/etc/slurm/slurm.key" in warning and "munge" in warning and "placeholder" in warning, warning
    assert key_refusal(tmp_path) is not None  # auth/slurm: the key is what authenticates
    socket_path = tmp_path / "run/munge/munge.socket.2"
    socket_path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as munged:  # the host's munged, mounted in
        munged.bind(str(socket_path))
        munged.listen()
        assert key_refusal(tmp_path) is None
        [warning] = problems(tmp_path)
        assert "not used while munge authenticates" in warning, warning


@pytest.mark.parametrize("which", ["password_file", "repair_password_file"])
@pytest.mark.parametrize("value", ["replace-me", "short-but-real1", "REPLACE-ME-0123456789abcdef"])
def test_the_database_password_is_refused_at_start_when_guessable(tmp_path, which, value):
    """`slurm-ext accounting config` (the accounting role's first start step) refuses a placeholder or short
    password, naming the file, before it writes anything."""
    from helpers.cli import cli
    strong = tmp_path / "strong"
    strong.write_text(os.urandom(24).hex())
    weak = tmp_path / "weak"
    weak.write_text(value + "\n")
    for path in (strong, weak):
        path.chmod(0o600)
    files = {"password_file": strong, "repair_password_file": strong, which: weak}
    conf = tmp_path / "slurm-ext.toml"
    volume = tmp_path / "volume"
    conf.write_text(f'[node]\nruntime_dir = "{tmp_path / "run"}"\n[accounting]\nrun_database = true\n'
                    f'volume = "{volume}"\nslurmdbd_conf = "{tmp_path / "slurmdbd.conf"}"\nslurm_user = "root"\n'
                    + "".join(f'{key} = "{path}"\n' for key, path in files.items()))
    done = cli("--config", str(conf), "accounting", "config", "--no-slurmdbd")
    assert done.returncode != 0
    assert str(weak) in done.stderr, done.stderr
    assert ("placeholder" in done.stderr) == ("replace" in value.lower()), done.stderr
    assert not volume.exists() and not (tmp_path / "slurmdbd.conf").exists()


# -- who may reach what (issue 28, item 7) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    """A source of traffic: a pod (its labels), an address outside the cluster, or a pod's own node (the kubelet)."""

    name: str
    labels: dict | None = None
    address: str = ""
    own_node: bool = False


def _selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels, matchExpressions: In, NotIn, Exists, DoesNotExist) against `labels`."""
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for rule in selector.get("matchExpressions", []):
        key, op, values = rule["key"], rule["operator"], rule.get("values", [])
        if not {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[op]:
            return False
    return True


def _peer_allowed(peer_rule: dict, source: Peer) -> bool:
    if "ipBlock" in peer_rule:
        if not source.address:
            return False
        address = ipaddress.ip_address(source.address)
        block = peer_rule["ipBlock"]
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(cidr) for cidr in block.get("except", []))
    assert "namespaceSelector" not in peer_rule  # every rule here is about this namespace's pods
    return source.labels is not None and _selects(peer_rule["podSelector"], source.labels)


def _port_allowed(port_rule: dict, port: int, protocol: str, named: dict[str, int]) -> bool:
    if port_rule.get("protocol", "TCP") != protocol:
        return False
    if "port" not in port_rule:
        return True
    first = named.get(port_rule["port"]) if isinstance(port_rule["port"], str) else port_rule["port"]
    return first is not None and first <= port <= port_rule.get("endPort", first)


def reachable(policies: list[dict], target_labels: dict, named_ports: dict[str, int], source: Peer, port: int,
              protocol: str = "TCP") -> bool:
    """Whether `source` may open `port` on a pod with `target_labels` under `policies`, as a NetworkPolicy
    implementation decides: a pod no policy selects takes everything; a selected one what some rule of some
    policy selecting it allows; its own node always (the kubelet's probes)."""
    selecting = [p["spec"] for p in policies if _selects(p["spec"]["podSelector"], target_labels)
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting or source.own_node:
        return True
    return any((not rule.get("from") or any(_peer_allowed(peer, source) for peer in rule["from"]))
               and (not rule.get("ports") or any(_port_allowed(p, port, protocol, named_ports) for p in rule["ports"]))
               for spec in selecting for rule in spec.get("ingress", []))


def _pod_labels(kind: str, name: str) -> dict:
    doc = _doc(kind, name)
    if kind == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    return doc["spec"]["template"]["metadata"]["labels"]


#: every pod the manifests make: (kind, name, its container field or name)
_PODS = {"slurmd": ("NodeSet", "gpu", "slurmd"), "slurmctld": ("Controller", "slurm", "slurmctld"),
         "slurmdbd": ("Accounting", "slurm", "slurmdbd"), "login": ("LoginSet", "login", "login"),
         "mariadb": ("StatefulSet", "mariadb", "mariadb"),
         "accounting-backup": ("CronJob", "slurm-accounting-backup", "backup")}
#: the roles of the agents in those pods (the accounting role: slurmdbd's, and mariadb's)
_ROLES = {"slurmd": "worker", "slurmctld": "controller", "slurmdbd": "accounting", "login": "login",
          "mariadb": "accounting"}


def _agent_port(pod_name: str) -> int:
    kind, name, field = _PODS[pod_name]
    pod, container = _agent_pod(kind, name, field)
    env = {e["name"] for e in container.get("env", [])}
    loaded = _agent_config(pod, container) if config.ENV_VAR in env else config.from_dict({})
    return loaded.supervisor.port(_ROLES[pod_name])


def _sources() -> list[Peer]:
    pods = [Peer(name, _pod_labels(*_PODS[name][:2])) for name in _PODS]
    return pods + [Peer("a user's pod", {"app": "notebook"}), Peer("an unlabelled pod", {}),
                   Peer("an address outside", address="203.0.113.7"), Peer("the pod's own node", own_node=True)]


def test_every_pod_carries_the_label_the_policies_select_on():
    for pod_name, (kind, name, _) in _PODS.items():
        assert _pod_labels(kind, name)["slurm-ext.io/pod"] == pod_name


@pytest.mark.parametrize("target", ["slurmd", "slurmctld", "slurmdbd", "login", "mariadb"])
def test_an_agents_port_is_reachable_from_the_controller_and_the_kubelet_only(target):
    policies = [doc for _, doc in _documents() if doc["kind"] == "NetworkPolicy"]
    kind, name, field = _PODS[target]
    _, container = _agent_pod(kind, name, field)
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    port = _agent_port(target)
    labels = _pod_labels(kind, name)
    allowed = {source.name for source in _sources() if reachable(policies, labels, named, source, port)}
    assert allowed == {"slurmctld", "the pod's own node"} | ({target} if target == "slurmctld" else set()), allowed


@pytest.mark.parametrize("target, port, protocol", [("slurmd", 6818, "TCP"), ("slurmd", 40000, "TCP"),
                                                    ("slurmd", 9814, "TCP"), ("slurmd", 5353, "UDP"),
                                                    ("slurmctld", 6817, "TCP"), ("slurmdbd", 6819, "TCP"),
                                                    ("login", 22, "TCP"), ("slurmd", 9809, "TCP")])
def test_slurms_own_ports_and_the_jobs_stay_open_as_before(target, port, protocol):
    """slurmd, slurmctld, slurmdbd, sshd, srun's and the jobs' ports (MPI, NCCL) are not what the policies are for."""
    policies = [doc for _, doc in _documents() if doc["kind"] == "NetworkPolicy"]
    labels = _pod_labels(*_PODS[target][:2])
    assert all(reachable(policies, labels, {}, source, port, protocol) for source in _sources())


def test_mariadb_is_reachable_from_slurmdbd_the_controller_and_the_backup_job_only():
    policies = [doc for _, doc in _documents() if doc["kind"] == "NetworkPolicy"]
    _, pod, mariadb = _mariadb()
    named = {p["name"]: p["containerPort"] for p in mariadb["ports"]}
    labels = _pod_labels("StatefulSet", "mariadb")
    allowed = {source.name for source in _sources() if reachable(policies, labels, named, source, named["mysql"])}
    assert allowed == {"slurmdbd", "slurmctld", "accounting-backup", "the pod's own node"}, allowed
    # and nothing else of that pod from anywhere but its node
    for port in (22, 4444, 4567, 33060):
        assert {s.name for s in _sources() if reachable(policies, labels, named, s, port)} == {"the pod's own node"}
    # the policy's rule names the port the database listens on
    loaded = _agent_config(pod, mariadb)
    assert named["mysql"] == loaded.accounting.db_port


def test_the_selector_logic_itself():
    """The evaluator the tests above rely on, on NetworkPolicy's own documented cases."""
    deny_all = {"spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    anyone = Peer("x", {"a": "b"})
    assert reachable([], {"app": "db"}, {}, anyone, 1) is True  # no policy: open
    assert reachable([deny_all], {"app": "db"}, {}, anyone, 1) is False
    assert reachable([deny_all], {"app": "db"}, {}, Peer("node", own_node=True), 1) is True
    egress_only = {"spec": {"podSelector": {}, "policyTypes": ["Egress"]}}
    assert reachable([egress_only], {}, {}, anyone, 1) is True
    block = {"spec": {"podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]},
                      "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                                   "ports": [{"port": "db"}]}]}}
    assert reachable([block], {"app": "db"}, {"db": 5432}, Peer("in", address="10.2.3.4"), 5432) is True
    assert reachable([block], {"app": "db"}, {"db": 5432}, Peer("except", address="10.1.3.4"), 5432) is False
    assert reachable([block], {"app": "db"}, {"db": 5432}, Peer("in", address="10.2.3.4"), 5433) is False
    assert reachable([block], {"app": "web"}, {}, Peer("out", address="1.2.3.4"), 1) is True  # not selected


# -- the repair executor's rights (issue 28, item 21) ----------------------------------------------------------

def _repair_account() -> tuple[str, str]:
    """(namespace, service account) of the controller pod, whose repair executor talks to the Kubernetes API."""
    controller = _doc("Controller")["spec"]
    pod, container = controller["template"]["spec"], controller["slurmctld"]
    loaded = _agent_config(pod, container)
    return loaded.repair.kubernetes_namespace, pod["serviceAccountName"]


def test_the_repair_executor_has_exactly_the_rights_it_uses():
    namespace, account = _repair_account()
    assert _doc("ServiceAccount", account)["automountServiceAccountToken"] is False
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    role, binding = _doc("Role", "slurm-ext-repair"), _doc("RoleBinding", "slurm-ext-repair")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "slurm-ext-repair"}
    assert binding["subjects"] == subject
    nodes, node_binding = _doc("ClusterRole"), _doc("ClusterRoleBinding")
    assert nodes["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert node_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                       "name": nodes["metadata"]["name"]}
    assert node_binding["subjects"] == subject
    # no other role or binding in the manifests
    assert sorted(doc["kind"] for _, doc in _documents() if "Role" in doc["kind"]) == [
        "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    # and the executor calls nothing else of the API: each call it makes is one of those rights
    rights = {"read_namespaced_pod": ("pods", "get"), "delete_namespaced_pod": ("pods", "delete"),
              "patch_node": ("nodes", "patch"), "read_node": ("nodes", "get")}
    import inspect
    import re
    from slurm_ext.repair import executors
    source = inspect.getsource(executors._kubernetes)  # where the executor holds its CoreV1Api as `api`
    assert "api = client.CoreV1Api(" in source
    calls = set(re.findall(r"\bapi\.(\w+)\(", source))
    assert calls and calls <= set(rights), calls
    granted = {(rule["resources"][0], verb) for doc in (role, nodes) for rule in doc["rules"] for verb in rule["verbs"]}
    assert {rights[call] for call in calls} <= granted


def test_the_repair_token_is_root_only_where_the_executor_reads_it_and_the_page_is_not_root():
    """The kubelet's automount is 0644, readable by the page's user in the controller pod: the token is mounted
    instead as a projected volume of root's only, where the Kubernetes client reads it (repair's default
    kubernetes_token_file, load_incluster_config's path)."""
    controller = _doc("Controller")["spec"]
    pod, container = controller["template"]["spec"], controller["slurmctld"]
    loaded = _agent_config(pod, container)
    assert pod["automountServiceAccountToken"] is False
    folder = str(Path(loaded.repair.kubernetes_token_file).parent)
    from kubernetes.config import incluster_config  # the executor's client reads the token there
    assert incluster_config.SERVICE_TOKEN_FILENAME == loaded.repair.kubernetes_token_file
    mount, volume = _volume_at(pod, container, folder)
    assert mount.get("readOnly") is True
    projected = volume["projected"]
    assert projected["defaultMode"] == 0o400 and all("mode" not in item for source in projected["sources"]
                                                     for kind in source.values() for item in kind.get("items", []))
    [token] = [source["serviceAccountToken"] for source in projected["sources"] if "serviceAccountToken" in source]
    assert token["path"] == Path(loaded.repair.kubernetes_token_file).name
    assert {item["path"] for source in projected["sources"] for kind in source.values()
            for item in kind.get("items", [])} == {Path(loaded.repair.kubernetes_ca_file).name, "namespace"}
    assert loaded.web.user == "slurm-ext-web"  # the image makes it (containers/Dockerfile)
    assert "useradd --system --no-create-home --shell /usr/sbin/nologin slurm-ext-web" in (
        REPO / "containers" / "Dockerfile").read_text()


def _node_patch_policy() -> dict:
    return _doc("ValidatingAdmissionPolicy", "slurm-ext-repair-node-patch")


def test_the_node_patch_policy_is_bound_and_matches_the_repair_account_only():
    namespace, account = _repair_account()
    policy = _node_patch_policy()["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["nodes"]}]
    [condition] = policy["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == 'system:serviceaccount:{namespace}:{account}'"
    binding = _doc("ValidatingAdmissionPolicyBinding")["spec"]
    assert binding == {"policyName": _node_patch_policy()["metadata"]["name"], "validationActions": ["Deny"]}


def _node_field_names(definition: str) -> list[str]:
    """The fields of a Kubernetes type, from kubernetes-validate's schemas of KUBERNETES."""
    import json
    schemas = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{KUBERNETES}-local-strict"
    return sorted(json.loads((schemas / definition).read_text())["properties"])


def test_the_node_patch_policy_keeps_every_field_but_unschedulable_and_the_rma_label():
    """By structure: one validation per field of the Node's spec (as Kubernetes KUBERNETES defines it) other than
    unschedulable, and per changeable field of its metadata, each saying it stays as it was."""
    expressions = [" ".join(v["expression"].split()) for v in _node_patch_policy()["spec"]["validations"]]
    kept = {"spec": [f for f in _node_field_names("nodespec-v1.json") if f != "unschedulable"],
            # labels have their own rules below; the rest of metadata is the API server's own or immutable
            "metadata": ["annotations", "finalizers", "ownerReferences"]}
    for part, fields in kept.items():
        for name in fields:
            field = f"{part}.{name}"
            assert (f"has(object.{field}) == has(oldObject.{field}) && (!has(object.{field}) || "
                    f"object.{field} == oldObject.{field})") in expressions, field
    assert len(expressions) == sum(map(len, kept.values())) + 3  # and unschedulable, labels changed, labels kept
    rma = config.from_dict({}).repair.kubernetes_rma_label
    assert any(f"k == '{rma}' ? object.metadata.labels[k] == 'true'" in e for e in expressions)
    assert _node_field_names("objectmeta-meta-v1.json") == [
        "annotations", "creationTimestamp", "deletionGracePeriodSeconds", "deletionTimestamp", "finalizers",
        "generateName", "generation", "labels", "managedFields", "name", "namespace", "ownerReferences",
        "resourceVersion", "selfLink", "uid"]  # a new field of metadata: decide whether the policy keeps it


NODE = {"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-node-7", "labels": {"kubernetes.io/hostname": "gpu-node-7",
                                                      "nvidia.com/gpu.present": "true", "pool": "training"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}, "finalizers": []},
        "spec": {"podCIDR": "10.244.7.0/24", "podCIDRs": ["10.244.7.0/24"], "providerID": "aws:///eu-west-1a/i-0abc",
                 "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}}


def _merge(base, patch):
    """A JSON merge patch (RFC 7386), as the API server applies a map patch: what the policy sees as `object`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


def _admitted(old: dict, patch: dict, user: str | None = None) -> list[str]:
    """The messages of the policy's validations that fail for `patch` on `old` (CEL, run by cel-python); [] when
    the API server would admit it. A user the matchCondition does not match is not judged at all."""
    import celpy
    policy = _node_patch_policy()["spec"]
    env = celpy.Environment()
    new = _merge(old, patch)
    namespace, account = _repair_account()
    activation = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
                  "request": celpy.json_to_cel({"userInfo": {"username": user or
                                                             f"system:serviceaccount:{namespace}:{account}"}})}
    [condition] = policy["matchConditions"]
    if not env.program(env.compile(condition["expression"])).evaluate(activation):
        return []
    return [v["message"] for v in policy["validations"]
            if not env.program(env.compile(v["expression"])).evaluate(activation)]


def test_the_node_patch_policy_admits_the_executors_own_patches():
    rma = config.from_dict({}).repair.kubernetes_rma_label
    # what repair/executors.py sends: failover cordons, remove cordons and labels
    assert _admitted(NODE, {"spec": {"unschedulable": True}}) == []
    assert _admitted(NODE, {"spec": {"unschedulable": True}, "metadata": {"labels": {rma: "true"}}}) == []
    cordoned = _merge(NODE, {"spec": {"unschedulable": True}, "metadata": {"labels": {rma: "true"}}})
    assert _admitted(cordoned, {"spec": {"unschedulable": True}, "metadata": {"labels": {rma: "true"}}}) == []
    bare = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {}}
    assert _admitted(bare, {"spec": {"unschedulable": True}, "metadata": {"labels": {rma: "true"}}}) == []


@pytest.mark.parametrize("patch, refused", [
    ({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}, "may add no label"),
    ({"metadata": {"labels": {"pool": "inference"}}}, "may add no label"),
    ({"metadata": {"labels": {"pool": None}}}, "may remove no label"),
    ({"metadata": {"labels": {"slurm-ext.io/rma": "false"}}}, "may add no label"),
    ({"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "30"}}}, "may change no annotation"),
    ({"metadata": {"finalizers": ["example.com/hold"]}}, "may change no finalizer"),
    ({"spec": {"taints": None}}, "may change no taint"),
    ({"spec": {"taints": [{"key": "x", "effect": "NoExecute"}]}}, "may change no taint"),
    ({"spec": {"podCIDR": "10.244.8.0/24"}}, "may change no podCIDR"),
    ({"spec": {"providerID": "aws:///eu-west-1a/i-0def"}}, "may change no providerID"),
], ids=["add a label", "change a label", "remove a label", "rma false", "annotation", "finalizer",
        "remove the taints", "add a taint", "podCIDR", "providerID"])
def test_the_node_patch_policy_refuses_every_other_change(patch, refused):
    [message] = _admitted(NODE, {"spec": {"unschedulable": True}, **{k: v for k, v in patch.items() if k != "spec"},
                                 **({"spec": {"unschedulable": True, **patch["spec"]}} if "spec" in patch else {})})
    assert refused in message
    # the same change by someone else is not this policy's business
    assert _admitted(NODE, patch, user="system:serviceaccount:kube-system:node-controller") == []


def test_the_node_patch_policy_refuses_an_uncordon():
    cordoned = _merge(NODE, {"spec": {"unschedulable": True}})
    assert _admitted(cordoned, {"spec": {"unschedulable": False}}) == ["the repair executor may cordon a node, "
                                                                      "never uncordon it"]
    assert _admitted(cordoned, {"spec": {"unschedulable": None}}) != []


def test_the_backup_cronjob_verifies_both_of_the_nights_backups(tmp_path):
    """Issue 28.1 (review): a night's backup is two dumps, the accounting database's and then slurm-ext's own
    (the repair history, written second, so the newest file). The verify container's script, run for real
    (on a directory of both, a stand-in `slurm-ext` that records its arguments), verifies each."""
    cronjob = _doc("CronJob", "slurm-accounting-backup")
    [verify] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert verify["command"][:2] == ["sh", "-c"]
    backups = tmp_path / "backups"
    backups.mkdir()
    accounting, own = backups / "slurm-20261201T000000Z.sql.gz", backups / "slurm-slurm_ext-20261201T000000Z.sql.gz"
    for age, path in ((100, backups / "slurm-20261130T000000Z.sql.gz"), (10, accounting), (5, own)):
        path.write_bytes(b"")
        os.utime(path, (1_800_000_000 - age, 1_800_000_000 - age))
    (tmp_path / "bin").mkdir()
    stand_in = tmp_path / "bin" / "slurm-ext"
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    stand_in.chmod(0o755)
    script = verify["command"][2].replace("/backups", str(backups))
    subprocess.run(["sh", "-c", script], env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}, check=True, timeout=30)
    assert (tmp_path / "calls").read_text().splitlines() == [f"accounting verify {accounting}",
                                                             f"accounting verify {own}"]
