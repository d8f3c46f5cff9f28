"""RunPod as a :class:`~ups.deploy.providers.base.Provider`: pods through its own SDK.

On demand: ``runpod.create_pod`` (the SDK's ``podFindAndDeployOnDemand``). Interruptible:
the ``podRentInterruptable`` mutation with ``bidPerGpu``, which the SDK lacks, sent through
its own GraphQL client (as SkyPilot's RunPod provisioner does). Every pod exposes
``22/tcp`` on a public IP and carries the run's label as its name (RunPod has no labels).
"""

from __future__ import annotations

from typing import Any

from ups.deploy.providers.base import (
    ORDER_PRICE,
    ApiErrorKind,
    Backoff,
    Capabilities,
    CreateRequest,
    Fault,
    Instance,
    Offer,
    OfferRequirements,
    ProviderApiError,
    Side,
    api_error,
    parse_label,
)
from ups.deploy.providers.runpod import client, offers
from ups.deploy.providers.runpod.client import ACCOUNT, graphql_string
from ups.deploy.providers.runpod.entry import RunPodHost
from ups.deploy.providers.runpod.pods import PROVIDER, instance_of, start_command
from ups.deploy.providers.runpod.sdk import RunPodApi

PORTS = "22/tcp"


class RunPodProvider:
    """RunPod's pods for one hosts.yaml entry (its cloud type, volume and disks)."""

    name = PROVIDER
    account = ACCOUNT
    capabilities = Capabilities(
        interruptible=True,
        stop_resume=True,
        labels=True,  # the pod's name
        self_destruct=True,  # the pod's own RUNPOD_API_KEY, scoped to it
        machine_identity=False,  # RunPod picks the machine at create
    )
    backoff = Backoff(
        api=client.RUNPOD_API,
        destroy=client.RUNPOD_DESTROY,
        running=client.RUNPOD_RUNNING,
        ssh=client.RUNPOD_SSH,
    )

    def __init__(self, api: RunPodApi, spec: RunPodHost) -> None:
        self.api = api
        self.spec = spec

    def search(self, requirements: OfferRequirements) -> list[Offer]:
        if requirements.order != ORDER_PRICE:
            raise api_error(
                ACCOUNT, ApiErrorKind.BAD_REQUEST, "search GPU types",
                detail=f"RunPod has no sort field {requirements.order!r}",
            )  # fmt: skip
        count = requirements.num_gpus or 1
        found: list[Offer] = []
        for country in requirements.regions or (None,):
            text = offers.gpu_types_query(count, self.spec.cloud_type, country)
            data = self.api.query("search GPU types", text)
            rows = list(data.get("gpuTypes") or [])
            found += offers.offers_of(rows, requirements, count, self.spec.cloud_type, country)
        return sorted(found, key=lambda o: o.price(requirements.interruptible))

    def create(self, offer: Offer, request: CreateRequest) -> str:
        spec, data = self.spec, offer.data
        fields: dict[str, Any] = {
            "name": request.label,
            "image_name": request.image,
            "gpu_type_id": data["gpu_type_id"],
            "cloud_type": data["cloud_type"],
            "gpu_count": data["gpu_count"],
            "volume_in_gb": round(request.disk_gb),
            "container_disk_in_gb": round(spec.container_disk_gb),
            "volume_mount_path": spec.volume_mount_path,
            "ports": PORTS,
            "docker_args": start_command(request.onstart),
            "env": {k: graphql_string(v) for k, v in request.env.items()},
            "country_code": data.get("country_code"),
        }
        what = f"create a pod from {offer.describe()}"
        if request.bid_per_hour is None:
            pod = self.api.call(what, lambda: self.api.sdk.create_pod(**fields))
        else:
            per_gpu = request.bid_per_hour / int(data["gpu_count"])
            text = spot_mutation(fields, per_gpu)
            pod = self.api.query(what, text)["podRentInterruptable"]
        if not pod or not pod.get("id"):
            raise api_error(ACCOUNT, ApiErrorKind.OTHER, what, detail=f"no pod in {pod!r}")
        return str(pod["id"])

    def get(self, instance_id: str) -> Instance | None:
        pod = self.api.call(f"show pod {instance_id}", lambda: self.api.sdk.get_pod(instance_id))
        return instance_of(pod) if pod else None

    def list(self, run_id: str | None = None) -> list[Instance]:
        pods = self.api.call("list pods", self.api.sdk.get_pods) or []
        found = [instance_of(p) for p in pods]
        return [
            i
            for i in found
            if (run := parse_label(i.label)) is not None and run_id in (None, run.run_id)
        ]

    def stop(self, instance_id: str) -> None:
        self.api.call(f"stop pod {instance_id}", lambda: self.api.sdk.stop_pod(instance_id))

    def resume(self, instance_id: str) -> None:
        pod = self.get(instance_id)
        count = int(pod.data.get("gpu_count", 1)) if pod else 1
        self.api.call(
            f"resume pod {instance_id}", lambda: self.api.sdk.resume_pod(instance_id, count)
        )

    def destroy(self, instance_id: str) -> None:
        try:
            self.api.call(
                f"terminate pod {instance_id}",
                lambda: self.api.sdk.terminate_pod(instance_id),
                kind="destroy",
            )
        except ProviderApiError as err:
            if err.kind is not ApiErrorKind.NOT_FOUND:
                raise

    def fault_of(self, instance: Instance) -> Fault | None:
        if instance.status_message and "dead" in instance.status_message.lower():
            return Fault(Side.HOST, "the pod died on its machine")
        return None

    def classify(self, status: int | None, body: object) -> ApiErrorKind:
        return client.classify(status, body)


def spot_mutation(fields: dict[str, Any], bid_per_gpu: float) -> str:
    """``podRentInterruptable`` for the same fields ``create_pod`` takes (RunPod's
    ``PodRentInterruptableInput``)."""
    parts = [
        f'name: "{graphql_string(fields["name"])}"',
        f'imageName: "{graphql_string(fields["image_name"])}"',
        f'gpuTypeId: "{graphql_string(fields["gpu_type_id"])}"',
        f"bidPerGpu: {bid_per_gpu:.4f}",
        f"cloudType: {fields['cloud_type']}",
        f"gpuCount: {int(fields['gpu_count'])}",
        f"volumeInGb: {int(fields['volume_in_gb'])}",
        f"containerDiskInGb: {int(fields['container_disk_in_gb'])}",
        f'volumeMountPath: "{graphql_string(fields["volume_mount_path"])}"',
        f'ports: "{fields["ports"]}"',
        f'dockerArgs: "{graphql_string(fields["docker_args"])}"',
        "startSsh: true",
        "supportPublicIp: true",
    ]
    if fields.get("country_code"):
        parts.append(f'countryCode: "{graphql_string(fields["country_code"])}"')
    env = ", ".join(f'{{ key: "{k}", value: "{v}" }}' for k, v in fields["env"].items())
    parts.append(f"env: [{env}]")
    return (
        f"mutation {{ podRentInterruptable(input: {{ {', '.join(parts)} }}) "
        "{ id desiredStatus imageName machineId } }"
    )
