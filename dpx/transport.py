"""Which transport a communicator runs on: one choice, made from what every rank reports,
the same on every rank (docs/semantics.md, "The peer transport").

A frontend asks each rank for its :class:`RankFacts` (its host, its device type, the kinds
of shared memory it can export and open), exchanges them, and calls
:func:`choose_transport` with every rank's facts: every rank computes the same
:class:`TransportChoice` from the same list, so no rank takes the peer transport alone.
After the peer transport's workspaces are exchanged, :func:`confirm_peer` takes each rank's
outcome of opening its peers' memory and falls back, again alike everywhere, when any
rank could not. ``explain`` prints the choice and its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dpx.errors import DpxMismatchValueError, DpxValueError
from dpx.modes import Transport

__all__ = ["MAX_PEERS", "RankFacts", "TransportChoice", "check_requested", "choose_transport",
           "confirm_peer"]

#: The most ranks the peer transport serves (its error word has one bit a rank).
MAX_PEERS = 63


@dataclass(frozen=True)
class RankFacts:
    """What one rank reports: ``host`` (ranks whose hosts are equal share memory),
    ``device`` (``"cuda"`` or ``"cpu"``: where its workspace would live), ``memory`` (the
    kinds of shared memory it can export and open, first choice first: ``"driver"`` /
    ``"torch"`` CUDA IPC, ``"host"`` shared memory files), ``why`` (when ``memory`` is
    empty: why not), and the options it was given (``options``: the phase bytes and the
    timeout, which every rank must share)."""

    host: str
    device: str
    memory: tuple[str, ...]
    why: str = ""
    options: tuple = ()


@dataclass(frozen=True)
class TransportChoice:
    """The transport a communicator runs on, what was requested, the shared memory kind
    every rank uses (the peer transport only) and why."""

    transport: Transport
    requested: Transport
    memory: str | None
    reason: str

    def __str__(self) -> str:
        extra = f" ({self.memory} memory)" if self.memory else ""
        return f"{self.transport.value}{extra}: {self.reason}"


def _ranks(rs: Sequence[int]) -> str:
    return ", ".join(map(str, rs)) if len(rs) <= 8 else f"{rs[0]}..{rs[-1]} ({len(rs)} ranks)"


def _by(facts: Sequence[RankFacts], field: str) -> tuple[dict[str, list[int]], str]:
    """The ranks by the value of one of their facts, and the groups in words."""
    groups: dict[str, list[int]] = {}
    for r, f in enumerate(facts):
        groups.setdefault(getattr(f, field), []).append(r)
    return groups, "; ".join(f"{v}: ranks {_ranks(rs)}" for v, rs in groups.items())


def _fallback(requested: Transport, why: str) -> TransportChoice:
    return TransportChoice(Transport.PER_ROOT, requested, None,
                           f"{requested.value} requested, per_root taken: {why}")


def check_requested(requested: Transport | str) -> Transport:
    """``requested`` as a transport a torch communicator runs on (``per_root`` or
    ``peer``), else the error (raised before any exchange, alike on every rank)."""
    t = Transport.parse(requested)
    if t is not Transport.PER_ROOT and t is not Transport.PEER:
        raise DpxValueError(f"transport={t.value!r}: a torch communicator runs on "
                            f"'per_root' or 'peer' ('ragged' and 'equal' are JAX's)")
    return t


def choose_transport(requested: Transport | str, facts: Sequence[RankFacts]) -> TransportChoice:
    """The transport of a communicator whose ranks report ``facts`` (rank order).
    ``requested``: ``per_root`` (collectives of the process group's backend) or ``peer``
    (puts and pulls in the ranks' shared memory; every rank's ``options`` must be equal,
    else every rank raises the same :class:`dpx.DpxMismatchValueError`; falls back to
    ``per_root`` where it cannot run -- ranks on several hosts or on different device
    types, a rank without a kind of shared memory every rank has, more than
    :data:`MAX_PEERS` ranks -- with the reason)."""
    requested = check_requested(requested)
    if requested is Transport.PER_ROOT:
        return TransportChoice(Transport.PER_ROOT, requested, None, "requested")
    if not facts:
        raise DpxValueError("choose_transport needs every rank's facts")
    options, where = _by(facts, "options")
    if len(options) > 1:   # a workspace of one layout on every rank, or none
        raise DpxMismatchValueError(f"transport='peer': the ranks' PeerOptions differ "
                                    f"(phase_bytes, timeout: {where})")
    if len(facts) > MAX_PEERS:
        return _fallback(requested, f"{len(facts)} ranks, more than the {MAX_PEERS} the "
                                    f"peer transport serves")
    hosts, where = _by(facts, "host")
    if len(hosts) > 1:
        return _fallback(requested, f"the ranks span {len(hosts)} hosts ({where}); peer "
                                    f"memory is shared within one host")
    devices, where = _by(facts, "device")
    if len(devices) > 1:
        return _fallback(requested, f"the ranks' devices differ ({where})")
    for r, f in enumerate(facts):
        if not f.memory:
            return _fallback(requested, f"rank {r} cannot share memory ({f.why or 'no kind'})")
    common = [k for k in facts[0].memory if all(k in f.memory for f in facts)]
    if not common:
        kinds = "; ".join(f"rank {r}: {', '.join(f.memory)}" for r, f in enumerate(facts))
        return _fallback(requested, f"no kind of shared memory every rank has ({kinds})")
    return TransportChoice(Transport.PEER, requested, common[0],
                           f"{len(facts)} ranks on one host share {facts[0].device} memory")


def confirm_peer(choice: TransportChoice, failures: Sequence[str]) -> TransportChoice:
    """``choice`` once every rank tried to open its peers' memory: ``failures[r]`` is rank
    ``r``'s error ("" when it opened every peer's). Any failure makes every rank fall back
    to ``per_root``, naming the first rank that failed."""
    bad = [(r, why) for r, why in enumerate(failures) if why]
    if choice.transport is not Transport.PEER or not bad:
        return choice
    r, why = bad[0]
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return _fallback(choice.requested, f"rank {r} could not open its peers' memory{more}: "
                                       f"{why}")
