"""deploy/kubernetes: every manifest valid against the Kubernetes API schemas (kubernetes-validate, strict: an
unknown or misspelt field fails), and held together: the names, ports, volumes, user and variables each refers to
exist where they are declared (the Deployment's, the Service's, the Dockerfile's, the settings')."""

import re
from pathlib import Path

import pytest
import yaml

from encoderrt.cli.serve import MODELS_ENV
from encoderrt.deploy.settings import SECTIONS
from encoderrt.runtime.settings import declared
from encoderrt.server.settings import ServerSettings

REPO = Path(__file__).parents[2]
FOLDER = REPO / "deploy" / "kubernetes"
KUBERNETES = ("1.29.0", "1.33.0")
"""The oldest release the manifests' fields need (autoscaling/v2 behavior, ReadOnlyMany claims) and a recent one."""


def _documents() -> list[dict]:
    kustomization = yaml.safe_load((FOLDER / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in yaml.safe_load_all((FOLDER / name).read_text())]


def _one(kind: str) -> dict:
    (found,) = [doc for doc in _documents() if doc["kind"] == kind]
    return found


def test_the_kustomization_lists_every_manifest_of_the_folder():
    kustomization = yaml.safe_load((FOLDER / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in FOLDER.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("version", KUBERNETES)
def test_each_manifest_is_valid_for_kubernetes(version):
    import kubernetes_validate

    documents = _documents()
    assert {doc["kind"] for doc in documents} == {"Deployment", "Service", "HorizontalPodAutoscaler",
                                                  "PersistentVolumeClaim"}
    for doc in documents:
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_misspelt_field_is_caught():
    """The check above can fail: strict validation refuses a field the API does not have."""
    import kubernetes_validate

    deployment = _one("Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/health"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES[-1], strict=True)


def test_the_pieces_refer_to_each_other():
    deployment, service, autoscaler = _one("Deployment"), _one("Service"), _one("HorizontalPodAutoscaler")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["http"] == ServerSettings().port  # ENCODERRT_PORT is not set: the image's default, the settings'
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= set(ports)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    target = autoscaler["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    claims = {doc["metadata"]["name"] for doc in _documents() if doc["kind"] == "PersistentVolumeClaim"}
    volumes = pod["spec"]["volumes"]
    assert {v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v} == claims
    assert {m["name"] for m in container["volumeMounts"]} == {v["name"] for v in volumes}
    # the grace period outlasts the drain, so a rolling update never cuts a request off
    assert pod["spec"]["terminationGracePeriodSeconds"] > ServerSettings().shutdown_timeout


def test_the_deployment_runs_the_images_user_and_sets_only_real_variables():
    pod = _one("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    dockerfile = (REPO / "Dockerfile").read_text()
    uid = int(re.search(r"useradd .*--uid (\d+)", dockerfile).group(1))
    assert pod["securityContext"]["runAsUser"] == uid and pod["securityContext"]["runAsNonRoot"]
    assert re.search(r"^FROM base AS cpu-serve$", dockerfile, re.M) and container["image"].endswith("-cpu-serve")
    known = {item.env for _, cls in SECTIONS for item in declared(cls)} | {MODELS_ENV}
    assert {variable["name"] for variable in container["env"]} <= known
    bundled = re.search(r"^ENV ENCODERRT_MODELS=(\S+)$", dockerfile, re.M).group(1)
    assert next(v["value"] for v in container["env"] if v["name"] == MODELS_ENV) == bundled


def test_the_rayservice_names_the_ray_image_at_its_ray_version():
    service = yaml.safe_load((REPO / "deploy" / "kuberay-rayservice.yaml").read_text())
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM base AS ray$", dockerfile, re.M)
    assert re.search(r"^ARG RAY_VERSION=(\S+)$", dockerfile, re.M).group(1) == service["spec"]["rayClusterConfig"]["rayVersion"]
    cluster = service["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"], *(group["template"] for group in cluster["workerGroupSpecs"])]
    assert {c["image"] for pod in pods for c in pod["spec"]["containers"]} == {"encoderrt:0.1.0-ray"}
