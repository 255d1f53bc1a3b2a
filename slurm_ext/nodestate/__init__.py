"""The one owner of this node's Slurm state: every drain and resume of slurm-ext goes through here.

Parts of slurm-ext state what they want (`want(owner, reason)` /
`clear(owner)`); one reconciler, on the node agent's Slurm thread, makes the
node show the most severe want, resumes it only when none is left, and never
touches a reason that is not ours. The catalogue lists every reason slurm-ext
may set, its owner and its resume rule. Another process (the hook service,
a Python hook) posts its want to the agent with `post`; without an agent it
applies it itself, through the same rules. The controller's repair service
drains and resumes the nodes it repairs through `drain_for_repair` and
`resume_after_repair`, with the catalogue's `repair` kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from slurm_ext.errors import SlurmExtError
from slurm_ext.slurm import SlurmClient

from . import channel
from .catalogue import CATALOGUE, DrainKind, kind_of, stale_at_start
from .channel import SOCKET_NAME, ChannelServer
from .controller import HeldByOthers, drain_for_repair, is_repair_reason, repair_reason, resume_after_repair
from .owner import NodeState, UnknownReason
from .reconciler import Reconciler, Ticket, registered

__all__ = ["CATALOGUE", "DrainKind", "kind_of", "stale_at_start", "NodeState", "UnknownReason", "Reconciler", "Ticket",
           "registered", "ChannelServer", "SOCKET_NAME", "DrainNotConfirmed", "post", "post_clear", "look_now",
           "socket_path",
           "HeldByOthers", "repair_reason", "is_repair_reason", "drain_for_repair", "resume_after_repair"]


class DrainNotConfirmed(SlurmExtError):
    """The agent took a want but Slurm has not shown it yet (the agent keeps trying)."""


def socket_path(runtime_dir: str | Path) -> Path:
    return Path(runtime_dir) / SOCKET_NAME


def post(runtime_dir: str | Path, owner: str, reason: str, *, node: str, slurm: Callable[[], SlurmClient],
         emit: Callable[..., object], timeout: float, **fields) -> str:
    """Have the node drained for `owner`'s `reason`: by the agent when one runs, else here; returns the outcome.

    `slurm` makes the client only when no agent answers (most calls never need one); `fields` go into the
    journal's drain event.

    Raises:
        UnknownReason: the reason is not catalogued for `owner` (a bug).
        DrainNotConfirmed: the agent did not confirm within `timeout`.
        SlurmExtError: no agent, and Slurm refused or did not answer.
    """
    return _ask(runtime_dir, {"owner": owner, "want": reason, "fields": fields}, node, slurm, emit, timeout)


def post_clear(runtime_dir: str | Path, owner: str, *, node: str, slurm: Callable[[], SlurmClient],
               emit: Callable[..., object], timeout: float) -> str:
    """`owner`'s condition is gone: have its drain lifted (by the agent when one runs, else here), as `post`.

    Raises: as `post` (UnknownReason aside).
    """
    return _ask(runtime_dir, {"owner": owner, "clear": True}, node, slurm, emit, timeout)


def look_now(runtime_dir: str | Path, timeout: float) -> str:
    """Have the agent's owner make Slurm agree now; returns the reason the node shows after it ('' when no agent
    answers: a one-off owner would have nothing to apply).

    Raises:
        DrainNotConfirmed: the agent did not answer within `timeout`, or Slurm did not.
    """
    try:
        answer = channel.request(socket_path(runtime_dir), {"look": True}, timeout)
    except channel.NoAgent:
        return ""
    except TimeoutError as err:
        raise DrainNotConfirmed(str(err)) from None
    if not answer.get("ok"):
        raise DrainNotConfirmed(f"the agent could not look at the node now: {answer.get('error')}")
    return answer.get("outcome", "")


def _ask(runtime_dir, message: dict, node: str, slurm, emit, timeout: float) -> str:
    try:
        answer = channel.request(socket_path(runtime_dir), message, timeout)
    except channel.NoAgent:
        reconciler = Reconciler(slurm(), node, emit, lift_stale=False)
        ticket = (reconciler.clear(message["owner"]) if message.get("clear")
                  else reconciler.want(message["owner"], message["want"], **message.get("fields", {})))
        reconciler.reconcile()
        return ticket.outcome or "not shown yet"
    except TimeoutError as err:
        raise DrainNotConfirmed(str(err)) from None
    if not answer.get("ok"):
        raise DrainNotConfirmed(f"the agent did not confirm the drain: {answer.get('error')}")
    return answer.get("outcome", "")
