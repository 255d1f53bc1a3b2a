"""Executors: how reprovision, failover and remove are carried out (reboot runs through Slurm).

`command`: bare metal. Each action is a command the site writes (its
provisioning tool, its RMA ticket), run with {node} filled in, killed past
repair.command_timeout; a non-zero exit fails the repair with its output.
What it prints reaches the history and the page: its tail only, control
characters escaped.

`kubernetes`: worker pods of a Slinky NodeSet, through the official
client. reprovision deletes the node's pod (its NodeSet makes a new one
from the image); failover cordons the Kubernetes node under it and
deletes the pod, so the new one lands elsewhere; remove also labels that
Kubernetes node for RMA (repair.kubernetes_rma_label=true). The bearer
token goes only to an API server verified with repair.kubernetes_ca_file,
unless repair.kubernetes_insecure says otherwise.

Either way a node name is checked first: it goes into a site's command as
one argument, and one starting with `-` would be an option of that tool
(ssh's `-oProxyCommand=...` runs a command).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from slurm_ext import command
from slurm_ext.errors import CommandError, CommandTimeout, SlurmExtError
from slurm_ext.log import printable

from .settings import RepairSection

__all__ = ["ExecutorFailed", "Outcome", "run_action", "NODE_NAME", "OUTPUT_LIMIT"]

#: longest one Kubernetes API request may take
_API_TIMEOUT = 30.0
#: a node name an executor takes: a letter or digit first (never an option), then no space, quote or shell character
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: characters of a command's output (its tail) that an outcome or a failure keeps
OUTPUT_LIMIT = 4000


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
        ExecutorFailed: a node name the executor refuses (checked before anything runs), not configured for it,
            failed, or timed out (the message says which and its output).
    """
    if not NODE_NAME.fullmatch(node):
        raise ExecutorFailed(f"node name {node!r} refused: an executor takes only names of letters, digits, "
                             "'.', '_' and '-' that start with a letter or digit (a leading '-' would be an option of "
                             "the site's tool); nothing was run")
    if settings.executor == "kubernetes":
        return _kubernetes(settings, action, node)
    return _command(settings, action, node)


def _command(settings: RepairSection, action: str, node: str) -> Outcome:
    template = settings.commands.get(action)
    if not template:
        raise ExecutorFailed(f"no command for {action}: set repair.commands.{action} (a list, {{node}} is the node)")
    argv = [word.replace("{node}", node) for word in template]
    shown = printable(" ".join(argv))
    try:
        result = command.run(argv, settings.command_timeout)
    except CommandTimeout as err:
        said = f": {_tail(err.stderr)}" if err.stderr else ""
        raise ExecutorFailed(f"{shown} did not finish within {settings.command_timeout:g}s and was killed{said}"
                             ) from None
    except CommandError as err:  # a non-zero exit, or it could not start (then stderr says why)
        how = f"exited with status {err.returncode}" if err.returncode is not None else "could not start"
        said = f": {_tail(err.stderr)}" if err.stderr else ""
        raise ExecutorFailed(f"{shown} {how}{said}") from None
    return Outcome(f"{shown} exited 0", _tail((result.stdout + result.stderr).strip()))


def _tail(text: str) -> str:
    """The last OUTPUT_LIMIT characters of what a command printed, control characters escaped: it is shown in the
    history, on the page and in a terminal, and a script's output may hold anything (escape sequences too)."""
    return printable(text[-OUTPUT_LIMIT:])[-OUTPUT_LIMIT:]


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
                             f"{printable(str(err.reason))}: {printable((err.body or '')[:500])}"
                             + (f" (after: {'; '.join(done)})" if done else "")) from None
    except Exception as err:  # the client's transport errors (refused, TLS, timeout) and answers it cannot read
        raise ExecutorFailed(f"no answer from the Kubernetes API for {action} of pod {namespace}/{pod_name}: "
                             f"{printable(str(err))}" + (f" (after: {'; '.join(done)})" if done else "")) from None
    return Outcome("; ".join(done))


def _api_client(settings: RepairSection):
    """The client of the in-cluster service account, or of repair.kubernetes_api with its token and CA.

    Raises:
        ExecutorFailed: the API would be talked to unverified (plain http, or no CA file) without
            repair.kubernetes_insecure, or the token file cannot be read; checked before any connection.
    """
    from kubernetes import client, config as kube_config
    if not settings.kubernetes_api:
        kube_config.load_incluster_config()
        return client.ApiClient()
    _refuse_unverified(settings)
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
    else:  # repair.kubernetes_insecure said so (_refuse_unverified)
        configuration.verify_ssl = False
    configuration.retries = 0
    return client.ApiClient(configuration)


def _refuse_unverified(settings: RepairSection) -> None:
    """Whoever answers an unverified API gets the bearer token (which may patch every node) and is believed about
    which node a pod runs on: only an explicit repair.kubernetes_insecure = true allows it (a test server)."""
    if settings.kubernetes_insecure:
        return
    api = settings.kubernetes_api
    if not api.startswith("https://"):
        raise ExecutorFailed(f"repair.kubernetes_api {api} is plain http: the bearer token would go in clear to "
                             "whoever answers; use https with repair.kubernetes_ca_file (or set "
                             "repair.kubernetes_insecure = true, for a test server only); nothing was sent")
    if not settings.kubernetes_ca_file:
        raise ExecutorFailed(f"repair.kubernetes_ca_file is empty: the API server {api} would get the bearer token "
                             "without its certificate being verified; set repair.kubernetes_ca_file to its CA (or "
                             "repair.kubernetes_insecure = true, for a test server only); nothing was sent")
