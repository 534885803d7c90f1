"""deploy/compose.yaml and deploy/kubernetes/: valid, consistent, and runnable by the real CLI.

Kustomize is not installed here, so :func:`render` does the little of it these files use
(resources, components, JSON 6902 patches, ``labels``, ``images``); every rendered object
is validated against the Kubernetes schemas that ``kubernetes-validate`` ships, and every
command line is parsed by the real ``infera-run`` (an unknown flag fails).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from cli_check import check_command, known_env

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if p.is_dir())
KUBERNETES_VERSION = "1.30.0"  # the oldest we support: the preStop `sleep` action needs it

Doc = dict[str, Any]


def entrypoint(dockerfile: str) -> list[str]:
    """The infera-run arguments an image's ENTRYPOINT starts with (after infera-entrypoint)."""
    text = (ROOT / dockerfile).read_text()
    [entry] = re.findall(r"^ENTRYPOINT (.+)$", text, re.M)
    argv = json.loads(entry)
    assert argv[0] == "infera-entrypoint"
    return list(argv[1:])


def image_entrypoint(image: str) -> list[str]:
    name = image.split(":")[0].rsplit("/", 1)[-1]
    assert name.startswith("infera-"), image
    return entrypoint(f"deploy/docker/{name.removeprefix('infera-')}.Dockerfile")


def substitute(arg: str) -> str:
    """Kubernetes $(VAR) and compose ${VAR:-default} as the runtime would fill them."""
    arg = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", arg)
    return re.sub(r"\$\((\w+)\)", "10.0.0.7", arg)


def flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == "--":
            return None
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name:
            return args[i + 1]
    return None


# -- a tiny kustomize ------------------------------------------------------------------------
def _patch(doc: Doc, ops: list[Doc]) -> None:
    for op in ops:
        *parents, last = [p for p in op["path"].split("/") if p]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert op["op"] in ("replace", "add"), op
        if isinstance(node, list):
            node[int(last)] = op["value"]
        else:
            assert op["op"] == "add" or last in node, f"patch path {op['path']} does not exist"
            node[last] = op["value"]


def render(directory: Path) -> list[Doc]:
    kfile = directory / "kustomization.yaml"
    assert kfile.exists(), f"{directory} has no kustomization.yaml"
    spec = yaml.safe_load(kfile.read_text())
    docs: list[Doc] = []
    for entry in spec.get("resources", []):
        target = (directory / entry).resolve()
        assert target.exists(), f"{kfile}: resource {entry} does not exist"
        if target.is_dir():
            docs += render(target)
        else:
            docs += [d for d in yaml.safe_load_all(target.read_text()) if d]
    for entry in spec.get("components", []):
        component = (directory / entry).resolve()
        assert yaml.safe_load((component / "kustomization.yaml").read_text())["kind"] == "Component"
        docs += [d for d in render(component) if d.get("kind") != "__patch__"]
        for patch in yaml.safe_load((component / "kustomization.yaml").read_text()).get("patches", []):
            ops = yaml.safe_load((component / patch["path"]).read_text())
            targets = [
                d
                for d in docs
                if d["kind"] == patch["target"]["kind"] and d["metadata"]["name"] == patch["target"]["name"]
            ]
            assert targets, f"{component}: patch target {patch['target']} not found"
            for target_doc in targets:
                _patch(target_doc, ops)
    for labels in spec.get("labels", []):
        for d in docs:
            d["metadata"].setdefault("labels", {}).update(labels["pairs"])
    for image in spec.get("images", []):
        for container in containers(docs):
            if container["image"].split(":")[0] == image["name"]:
                container["image"] = f"{image['name']}:{image['newTag']}"
    return docs


def pod_specs(docs: list[Doc]) -> list[tuple[Doc, Doc]]:
    """(workload, pod template) of every Deployment/StatefulSet."""
    return [(d, d["spec"]["template"]) for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def containers(docs: list[Doc]) -> list[Doc]:
    return [c for _, t in pod_specs(docs) for c in t["spec"]["containers"]]


def by_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def verbs_of(docs: list[Doc], account: str, resource: str = "pods") -> set[str]:
    """What a service account may do on ``resource``, through its RoleBindings."""
    roles = by_kind(docs, "Role")
    verbs: set[str] = set()
    for binding in by_kind(docs, "RoleBinding").values():
        if any(s["name"] == account for s in binding["subjects"]):
            for rule in roles[binding["roleRef"]["name"]]["rules"]:
                if resource in rule["resources"]:
                    verbs.update(rule["verbs"])
    return verbs


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- Kubernetes --------------------------------------------------------------------------------
def test_every_manifest_file_is_used_by_a_kustomization() -> None:
    used: set[Path] = set()
    for kfile in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kfile.read_text())
        for entry in spec.get("resources", []) + [p["path"] for p in spec.get("patches", [])]:
            used.add((kfile.parent / entry).resolve())
    orphans = {p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml"} - used
    assert not orphans, f"manifests no kustomization uses: {sorted(map(str, orphans))}"
    assert {p.name for p in OVERLAYS} >= {"vllm", "sglang", "atom", "pd"}


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_renders_to_valid_consistent_objects(overlay: Path) -> None:
    docs = render(overlay)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), f"duplicate objects: {names}"
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc.message}"
            )
    accounts, services = by_kind(docs, "ServiceAccount"), by_kind(docs, "Service")
    workloads = {d["metadata"]["name"]: t for d, t in pod_specs(docs)}
    for workload, template in pod_specs(docs):
        account = template["spec"].get("serviceAccountName")
        assert account is None or account in accounts, (
            f"{workload['metadata']['name']}: no ServiceAccount {account}"
        )
        if workload["kind"] == "StatefulSet":
            assert workload["spec"]["serviceName"] in services
        assert selects(workload["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
    for service in services.values():
        assert any(
            selects(service["spec"]["selector"], t["metadata"]["labels"]) for t in workloads.values()
        ), f"Service {service['metadata']['name']} selects no pods"
    router = workloads["infera-router"]
    for pdb in by_kind(docs, "PodDisruptionBudget").values():
        assert selects(pdb["spec"]["selector"]["matchLabels"], router["metadata"]["labels"])
    [hpa] = by_kind(docs, "HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"]["name"] in workloads
    assert any(
        m["type"] == "Pods" and "in_flight" in m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]
    )
    for binding in by_kind(docs, "RoleBinding").values():
        assert binding["subjects"][0]["name"] in accounts
        assert binding["roleRef"]["name"] in by_kind(docs, "Role")
    assert {"list", "watch"} <= verbs_of(docs, router["spec"]["serviceAccountName"])
    # budgets shared by the router replicas live in ConfigMaps: get, create and update only
    state = verbs_of(docs, router["spec"]["serviceAccountName"], "configmaps")
    assert state == {"get", "create", "update"}, state
    for account in set(accounts) - {router["spec"]["serviceAccountName"]}:
        assert not verbs_of(docs, account, "configmaps"), account


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_command_lines_run_and_drain_numbers_agree(overlay: Path) -> None:
    docs = render(overlay)
    workers = 0
    for workload, template in pod_specs(docs):
        pod = template["spec"]
        for container in pod["containers"]:
            if not container["image"].startswith("infera-"):
                continue
            args = [substitute(a) for a in container.get("args", [])]
            path = check_command(image_entrypoint(container["image"]) + args)
            infera_env = {e["name"] for e in container.get("env", []) if e["name"].startswith("INFERA_")}
            unknown = infera_env - known_env(image_entrypoint(container["image"]) + args)
            assert not unknown, f"{workload['metadata']['name']}: infera-run reads no {sorted(unknown)}"
            grace = pod["terminationGracePeriodSeconds"]
            pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
            if path[0] == "serve":
                assert pre_stop < grace
                continue
            workers += 1
            name = workload["metadata"]["name"]
            env = {e["name"]: e for e in container.get("env", [])}
            # --advertise-host is the pod IP, from the downward API
            assert flag(args, "--advertise-host") == "10.0.0.7"
            assert "$(POD_IP)" in " ".join(container["args"])
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            # drain (and the engine's stop) fit in the grace period, after preStop
            drain, stop = (
                float(flag(args, "--drain-timeout") or 30),
                float(flag(args, "--stop-timeout") or 10),
            )
            assert pre_stop + drain + stop < grace, f"{name}: {pre_stop}+{drain}+{stop} s >= grace {grace} s"
            limits = container["resources"]["limits"]
            assert any(k.endswith("/gpu") and int(v) >= 1 for k, v in limits.items()), f"{name}: no GPU"
            assert container["livenessProbe"]["httpGet"]["path"] == "/health"  # liveness = engine health
            # the labels the router selects on, and any hand-written annotations, agree with the flags
            notes = {**template["metadata"]["labels"], **template["metadata"].get("annotations", {})}
            assert notes["infera.io/engine"] == path[1]
            assert notes["infera.io/role"] == (flag(args, "--role") or "mixed")
            assert notes.get("infera.io/model", flag(args, "--model")) == flag(args, "--model")
            assert notes.get("infera.io/port", flag(args, "--port")) == flag(args, "--port")
            if "infera.io/kv-events-port" in notes:
                assert notes["infera.io/kv-events-port"] == flag(args, "--kv-events-port")
                size = flag(args, "--block-size") or flag(args, "--page-size")
                assert notes["infera.io/kv-block-size"] == size
            if flag(args, "--discovery-backend") == "kubernetes":
                # readiness = registered; the record goes onto the pod, which the account may patch
                ready = env["INFERA_K8S_READY_FILE"]["value"]
                assert container["readinessProbe"]["exec"]["command"] == ["test", "-f", ready]
                assert env["INFERA_K8S_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
                assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "infera-worker"
                assert "patch" in verbs_of(docs, pod["serviceAccountName"])
    assert workers >= 1


# -- compose -----------------------------------------------------------------------------------
def test_compose_file_parses_and_its_command_lines_run() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    assert "etcd" in services and "router" in services
    workers = [n for n, s in services.items() if "vllm" in str(s.get("image", ""))]
    assert len(workers) >= 2
    router = services["router"]
    assert check_command(
        entrypoint(router["build"]["dockerfile"]) + [substitute(a) for a in router["command"]]
    ) == ["serve"]
    devices = set()
    for name in workers:
        service = services[name]
        args = [substitute(a) for a in service["command"]]
        assert check_command(entrypoint(service["build"]["dockerfile"]) + args) == ["worker", "vllm"]
        infera_env = {k for k in service.get("environment", {}) if k.startswith("INFERA_")}
        assert infera_env <= known_env(entrypoint(service["build"]["dockerfile"]) + args)
        assert flag(args, "--advertise-host") == name  # reachable by its service name
        assert flag(args, "--etcd-endpoint") == "etcd:2379"
        [gpu] = service["deploy"]["resources"]["reservations"]["devices"]
        assert "gpu" in gpu["capabilities"]
        devices.update(gpu["device_ids"])
        grace = float(service["stop_grace_period"].removesuffix("s"))
        assert float(flag(args, "--drain-timeout") or 30) + float(flag(args, "--stop-timeout") or 10) < grace
    assert len(devices) == len(workers), "each worker reserves its own GPU"
