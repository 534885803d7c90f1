"""Settings of the ``kubernetes`` discovery backend (``INFERA_K8S_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field

from infera_core.config.settings import InferaSettings
from infera_k8s.pods import DEFAULT_SELECTOR


class KubernetesSettings(InferaSettings):
    """Where the worker pods are and how to reach the API server."""

    k8s_namespace: str | None = Field(
        None, description="Namespace of the worker pods [default: the service account's / kubeconfig's]."
    )
    k8s_selector: str = Field(DEFAULT_SELECTOR, description="Label selector of the worker pods.")
    k8s_api_server: str | None = Field(
        None, description="API server URL (e.g. kubectl proxy's) [default: in-cluster, then kubeconfig]."
    )
    k8s_kubeconfig: str | None = Field(
        None, description="Kubeconfig file [default: $KUBECONFIG, ~/.kube/config]."
    )
    k8s_watch_timeout: int = Field(
        300, ge=1, description="Seconds the API server keeps one watch request open before it is renewed."
    )
    k8s_page_size: int = Field(500, ge=1, description="Pods per list page (limit/continue).")
    k8s_retry_max: float = Field(
        10.0, gt=0, description="Longest wait between retries while the API server is unreachable (seconds)."
    )
    k8s_pod_name: str | None = Field(
        None,
        description="Worker side: this pod's name (downward API metadata.name); the launcher then "
        "publishes its record as the pod's infera.io/worker-record annotation (needs patch on pods).",
    )
    k8s_ready_file: str | None = Field(
        "/tmp/infera-ready",
        description="Worker side: file that exists while the worker is registered and active "
        "(the pod's readiness probe: test -f FILE); empty: none.",
    )
