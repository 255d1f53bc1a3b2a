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
    assert kinds == ["Accounting", "ConfigMap", "Controller", "CronJob", "LoginSet", "NodeSet",
                     "PersistentVolumeClaim", "Secret", "Service", "StatefulSet", "StorageClass"], kinds


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
def test_every_agent_has_the_agent_credential_as_a_root_only_file_from_one_secret(kind, name, field):
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
    stored = _doc("Secret", "slurm-ext-agent-credential")["stringData"]
    assert list(stored) == [path.name]


def test_the_agent_credentials_placeholder_is_refused_until_replaced(tmp_path):
    from slurm_ext.agentapi import CredentialError, CredentialFile
    placeholder = tmp_path / "agent-credential"
    placeholder.write_text(_doc("Secret", "slurm-ext-agent-credential")["stringData"]["agent-credential"])
    placeholder.chmod(0o400)
    with pytest.raises(CredentialError, match="expected at least 16"):
        CredentialFile(str(placeholder)).get()


def _password_secret() -> tuple[str, str]:
    ref = _doc("Accounting")["spec"]["storageConfig"]["passwordKeyRef"]
    return ref["name"], ref["key"]


@pytest.mark.parametrize("workload, container_name", [("mariadb", "mariadb"), ("slurm-accounting-backup", "backup")])
def test_the_database_password_is_only_a_mounted_secret_file(workload, container_name):
    [pod] = [pod for name, pod in _pod_specs() if name.endswith(f"/{workload}")]
    container = _container(pod, container_name)
    loaded = _agent_config(pod, container)
    password_file = Path(loaded.accounting.password_file)
    mount, volume = _volume_at(pod, container, str(password_file.parent))
    secret_name, key = _password_secret()
    assert volume["secret"]["secretName"] == secret_name
    assert password_file.name == key and "items" not in volume["secret"]
    assert mount["readOnly"] is True and volume["secret"]["defaultMode"] == 0o400


@pytest.mark.parametrize("name, pod", _pod_specs(), ids=[name for name, _ in _pod_specs()])
def test_no_pod_holds_the_password_in_its_environment_or_command_line(name, pod):
    from slurm_ext.accounting import PASSWORD_ENV
    secret_name, key = _password_secret()
    value = _doc("Secret", secret_name)["stringData"][key]
    for container in _containers(pod):
        assert "envFrom" not in container, name
        for env in container.get("env", []):
            assert "valueFrom" not in env and env["name"] != PASSWORD_ENV, (name, env)
        words = " ".join(container.get("command", []) + container.get("args", []))
        assert "password" not in words.lower() and value not in words, (name, words)


def test_the_password_secret_survives_reinstalls():
    """Slinky issue 44: a password regenerated at reinstall no longer opens the database kept on the volume."""
    secret_name, key = _password_secret()
    secret = _doc("Secret", secret_name)
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert key in secret["stringData"]
    text = (MANIFESTS / "secrets.yaml").read_text()
    assert f"kubectl create secret generic {secret_name} --from-literal={key}=" in text


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
