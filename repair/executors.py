"""Executors: how reprovision, failover and remove are carried out (reboot runs through Slurm).

`command`: bare metal. Each action is a command the site writes (its
provisioning tool, its RMA ticket), run with {node} filled in, killed past
repair.command_timeout; a non-zero exit fails the repair with its output.

`kubernetes`: worker pods of a Slinky NodeSet, through the official
client. reprovision deletes the node's pod (its NodeSet makes a new one
from the image); failover cordons the Kubernetes node under it and
deletes the pod, so the new one lands elsewhere; remove also labels that
Kubernetes node for RMA (repair.kubernetes_rma_label=true).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurm_ext import command
from slurm_ext.errors import CommandError, CommandTimeout, SlurmExtError

from .settings import RepairSection

__all__ = ["ExecutorFailed", "Outcome", "run_action"]

#: longest one Kubernetes API request may take
_API_TIMEOUT = 30.0


class ExecutorFailed(SlurmExtError):
    """The executor did not do the action; the message says what it answered."""


@dataclass(frozen=True, slots=True)
class Outcome:
    #: one line for the repair's history
    summary: str
    #: what the executor printed or answered, for the event's detail
    output: str = ""


def run_action(settings: RepairSection, action: str, node: str) -> Outcome:
    """Carry out `action` on `node` with the configured executor.

    Raises:
        ExecutorFailed: not configured for it, failed, or timed out (the message says which and its output).
    """
    if settings.executor == "kubernetes":
        return _kubernetes(settings, action, node)
    return _command(settings, action, node)


def _command(settings: RepairSection, action: str, node: str) -> Outcome:
    template = settings.commands.get(action)
    if not template:
        raise ExecutorFailed(f"no command for {action}: set repair.commands.{action} (a list, {{node}} is the node)")
    argv = [word.replace("{node}", node) for word in template]
    try:
        result = command.run(argv, settings.command_timeout)
    except CommandTimeout as err:
        raise ExecutorFailed(f"{argv[0]} did not finish within {settings.command_timeout:g}s and was killed: "
                             f"{err}") from None
    except CommandError as err:
        raise ExecutorFailed(f"{' '.join(argv)} failed: {err}") from None
    output = (result.stdout + result.stderr).strip()
    return Outcome(f"{' '.join(argv)} exited 0", output[-4000:])


def _kubernetes(settings: RepairSection, action: str, node: str) -> Outcome:
    from kubernetes import client  # only where a site runs its workers as pods
    from kubernetes.client.rest import ApiException
    api = client.CoreV1Api(_api_client(settings))
    namespace, pod_name = settings.kubernetes_namespace, settings.kubernetes_pod.replace("{node}", node)
    timeout = min(_API_TIMEOUT, settings.command_timeout)
    done = []
    try:
        pod = api.read_namespaced_pod(pod_name, namespace, _request_timeout=timeout)
        host = pod.spec.node_name
        if action in ("failover", "remove") and host:
            patch = {"spec": {"unschedulable": True}}
            if action == "remove":
                patch["metadata"] = {"labels": {settings.kubernetes_rma_label: "true"}}
            api.patch_node(host, patch, _request_timeout=timeout)
            done.append(f"cordoned Kubernetes node {host}" + (" and labelled it for RMA" if action == "remove" else ""))
        api.delete_namespaced_pod(pod_name, namespace, _request_timeout=timeout)
        done.append(f"deleted pod {namespace}/{pod_name}")
    except ApiException as err:
        raise ExecutorFailed(f"Kubernetes refused {action} of pod {namespace}/{pod_name}: {err.status} "
                             f"{err.reason}: {(err.body or '')[:500]}" + (f" (after: {'; '.join(done)})" if done else "")
                             ) from None
    except Exception as err:  # the client's transport errors (refused, TLS, timeout) and answers it cannot read
        raise ExecutorFailed(f"no answer from the Kubernetes API for {action} of pod {namespace}/{pod_name}: {err}"
                             + (f" (after: {'; '.join(done)})" if done else "")) from None
    return Outcome("; ".join(done))


def _api_client(settings: RepairSection):
    from kubernetes import client, config as kube_config
    if not settings.kubernetes_api:
        kube_config.load_incluster_config()
        return client.ApiClient()
    configuration = client.Configuration()
    configuration.host = settings.kubernetes_api
    if settings.kubernetes_token_file:
        try:
            token = Path(settings.kubernetes_token_file).read_text().strip()
        except OSError as err:
            raise ExecutorFailed(f"cannot read repair.kubernetes_token_file {settings.kubernetes_token_file}: "
                                 f"{err.strerror}") from None
        configuration.api_key = {"authorization": f"Bearer {token}"}
    if settings.kubernetes_ca_file:
        configuration.ssl_ca_cert = settings.kubernetes_ca_file
    else:
        configuration.verify_ssl = False
    configuration.retries = 0
    return client.ApiClient(configuration)
