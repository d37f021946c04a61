"""Arrow Flight client of ``rllm-pipe serve`` (see train/flight in the Go tree
for the protocol: a JSON ticket, batches with JSON app_metadata, and the
actions ack, set_policy_version, publish_policy_version and stats).

Security: the bearer token (``token=`` or ``$RLLM_PIPE_TOKEN``) goes in an
``authorization`` header on every call; a TLS server is reached with a
``grpc+tls://`` location and the CA certificate that signed its certificate
(``tls_root_certs=``, PEM bytes or a file path, or ``$RLLM_PIPE_CA``). Each
stream carries a secret key the client makes; actions on the stream carry
it, so no other client can acknowledge for it or move its policy version."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from .padded import Padded

if TYPE_CHECKING:  # pragma: no cover - torch is optional
    import torch


# pyarrow's complaint about a stream that ended cleanly before its first
# batch (no schema either): for the client, a stream with nothing in it.
# A stream the server ended with an error before its first batch raises
# the same complaint with the server's status in it ("Flight returned
# internal error, with message: ... Detail: Internal"): that one is an
# error, never an empty stream.
_EMPTY_STREAM = "Server never sent a data message"


def _ended_empty(e: Exception) -> bool:
    """Whether e is pyarrow's report of a stream that ended cleanly with
    nothing in it (and not of one the server ended with an error)."""
    msg = str(e).strip()
    return msg.startswith(_EMPTY_STREAM) and "Detail:" not in msg and "Flight returned" not in msg


@dataclass(frozen=True)
class TokenColumn:
    """A list<int32|float32> column as two flat numpy arrays sharing the Arrow
    buffers: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: np.ndarray  # read-only view of the Arrow buffer
    offsets: np.ndarray  # int32, len(rows) + 1

    def row(self, i: int) -> np.ndarray:
        """Row i's items (a view, no copy)."""
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        """Each row's number of items."""
        return self.offsets[1:] - self.offsets[:-1]


@dataclass
class Batch:
    """Whole groups of rows within the token budget: one row per step, or
    merged trajectory rows with ``serve --layout trajectories``."""

    record: pa.RecordBatch
    batch_id: int
    groups: List[str]
    tokens_total: int
    oversized: bool
    meta: Dict[str, Any]
    _client: "Client" = field(repr=False)
    acked: bool = False

    @property
    def num_rows(self) -> int:
        return self.record.num_rows

    def column(self, name: str) -> pa.Array:
        return self.record.column(self.record.schema.get_field_index(name))

    def tokens(self, name: str = "response_ids") -> TokenColumn:
        """The list column ``name`` as flat values and offsets, without copying
        the token data (the arrays are read-only views of the Arrow buffers)."""
        arr = self.column(name)
        if not pa.types.is_list(arr.type):
            raise TypeError(f"{name} is {arr.type}, not a list column")
        if arr.null_count:
            raise ValueError(f"{name} has null rows; use batch.column({name!r})")
        # offsets are absolute into values, also for a sliced array
        values = arr.values.to_numpy(zero_copy_only=True)
        offsets = arr.offsets.to_numpy(zero_copy_only=True)
        return TokenColumn(values=values, offsets=offsets)

    def tensors(self, name: str = "response_ids") -> Tuple[torch.Tensor, torch.Tensor]:
        """Like tokens, as torch tensors sharing the memory (torch must be
        installed; the tensors must not be written to)."""
        import warnings

        import torch

        col = self.tokens(name)
        with warnings.catch_warnings():
            # The Arrow buffers are read-only; torch warns that writing through
            # the tensor is undefined. Training reads token ids; it never writes.
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(col.values), torch.from_numpy(col.offsets)

    @property
    def step(self) -> Dict[str, int]:
        """The batch's place in its trainer step: {"step", "part", "parts",
        "groups"}. A step of ``serve --batch-groups N`` over ``--max-tokens``
        comes as several batches (part 0 first, one after another), to
        accumulate into one optimizer step; otherwise parts is 1."""
        st = self.meta.get("step") or {}
        return {"step": int(st.get("step", 0)), "part": int(st.get("part", 0)), "parts": int(st.get("parts", 1) or 1),
                "groups": int(st.get("groups", len(self.groups)))}

    @property
    def last_part(self) -> bool:
        """Whether the batch ends its step (always, for an unsplit step)."""
        st = self.step
        return st["part"] >= st["parts"] - 1

    @property
    def layout(self) -> str:
        """"trajectories" for merged trajectory rows (serve --layout
        trajectories), else "steps"."""
        return self.meta.get("layout") or "steps"

    def to_padded(
        self,
        pad_token_id: int,
        max_prompt_length: int,
        max_response_length: int,
        pad_rows_to_multiple: int = 1,
        **kwargs: Any,
    ) -> Padded:
        """The batch as padded tensors in verl's layout (numpy; ``.torch()``
        for torch tensors sharing the memory): see rllm_pipe.padded."""
        from .padded import to_padded

        return to_padded(self.record, pad_token_id, max_prompt_length, max_response_length, pad_rows_to_multiple, **kwargs)

    def ack(self, policy_version: Optional[int] = None) -> Dict[str, int]:
        """Acknowledge the batch: its groups are settled for the consumer group
        and never delivered again. Returns {"groups": n, "lost": m}; lost groups
        belonged to shards this member no longer held (delivered elsewhere).

        policy_version, if given, is reported first: the batch the server forms
        next is judged against it (batches already formed, up to the server's
        --max-inflight, were judged against the version current then)."""
        res = self._client.ack([self.batch_id], policy_version=policy_version, member=self.meta.get("member"))
        self.acked = True
        return res


class Client:
    """A member of the server's consumer group.

    location: "grpc://host:port" of ``rllm-pipe serve`` ("grpc+tls://" for a
    server with --tls-cert; implied by tls_root_certs).
    consumer: the member's stable name (a restart under the same name resumes
    its unfinished shards at once); random when omitted.
    policy_version: the trainer's current policy version, for staleness.
    batch_groups: exactly this many groups per trainer step (this member's
    ``serve --batch-groups``); None: the server's.
    versions_per_step: how far this trainer's policy version advances with
    each step it acknowledges (this member's ``serve --versions-per-batch``):
    the server judges staleness at the version a step will train with;
    None: the server's.
    token: the server's bearer token (default ``$RLLM_PIPE_TOKEN``; none when
    unset). It is sent on every call and never printed.
    tls_root_certs: the CA certificate(s) to trust, PEM bytes or the path of a
    PEM file (default: the file ``$RLLM_PIPE_CA`` names; else the system's).
    Other keyword arguments go to ``pyarrow.flight.FlightClient``.
    """

    def __init__(
        self,
        location: str,
        consumer: Optional[str] = None,
        policy_version: Optional[int] = None,
        token: Optional[str] = None,
        tls_root_certs: Optional[Union[bytes, str, os.PathLike[str]]] = None,
        batch_groups: Optional[int] = None,
        versions_per_step: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        if token is None:
            token = os.environ.get("RLLM_PIPE_TOKEN") or None
        if tls_root_certs is None and os.environ.get("RLLM_PIPE_CA"):
            tls_root_certs = os.environ["RLLM_PIPE_CA"]
        if tls_root_certs is not None:
            if not isinstance(tls_root_certs, bytes):
                with open(tls_root_certs, "rb") as f:
                    tls_root_certs = f.read()
            kwargs["tls_root_certs"] = tls_root_certs
            if location.startswith("grpc://"):
                location = "grpc+tls://" + location[len("grpc://") :]
        headers = [(b"authorization", b"Bearer " + token.strip().encode())] if token else None
        self._options = flight.FlightCallOptions(headers=headers)
        self._flight = flight.FlightClient(location, **kwargs)
        self.consumer = consumer
        self.policy_version = policy_version
        self.batch_groups = batch_groups
        self.versions_per_step = versions_per_step
        self._reader: Any = None  # the stream's FlightStreamReader
        self._key: Optional[str] = None  # the current (or last) stream's secret

    def __repr__(self) -> str:  # never shows the token or the stream's key
        return f"Client(consumer={self.consumer!r}, policy_version={self.policy_version!r})"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batches(self) -> Iterator[Batch]:
        """Stream batches until the server has nothing more (every committed
        shard done, when it does not follow the manifest) or the iteration is
        abandoned; batches not acknowledged by then go to other members."""
        self._key = secrets.token_hex(16)
        ticket: Dict[str, Any] = {"key": self._key}
        if self.consumer:
            ticket["consumer"] = self.consumer
        if self.policy_version is not None:
            ticket["policy_version"] = int(self.policy_version)
        if self.batch_groups is not None:
            ticket["batch_groups"] = int(self.batch_groups)
        if self.versions_per_step is not None:
            ticket["versions_per_step"] = int(self.versions_per_step)
        try:
            self._reader = self._flight.do_get(flight.Ticket(json.dumps(ticket).encode()), self._options)
        except flight.FlightInternalError as e:
            if _ended_empty(e):
                return  # the stream ended without a batch: nothing left
            raise
        try:
            while True:
                try:
                    chunk = self._reader.read_chunk()
                except StopIteration:
                    return
                meta = json.loads(chunk.app_metadata.to_pybytes()) if chunk.app_metadata else {}
                if self.consumer is None:
                    self.consumer = meta.get("consumer")
                yield Batch(
                    record=chunk.data,
                    batch_id=int(meta["batch_id"]),
                    groups=list(meta.get("groups", [])),
                    tokens_total=int(meta.get("tokens", 0)),
                    oversized=bool(meta.get("oversized", False)),
                    meta=meta,
                    _client=self,
                )
        finally:
            self._cancel()

    def _cancel(self) -> None:
        if self._reader is not None:
            try:
                self._reader.cancel()
            except Exception:
                pass
            self._reader = None

    def _action(self, kind: str, body: Dict[str, Any]) -> Any:
        results = list(self._flight.do_action(flight.Action(kind, json.dumps(body).encode()), self._options))
        return json.loads(results[0].body.to_pybytes()) if results else None

    def ack(self, batch_ids: Iterable[int], policy_version: Optional[int] = None, member: Optional[str] = None) -> Dict[str, int]:
        """Acknowledge delivered batches by id (reporting policy_version first,
        if given). member, the stream the batches came from (Batch.meta), makes
        the server refuse the ack if that stream has ended."""
        body: Dict[str, Any] = {"consumer": self.consumer, "key": self._key, "batch_ids": [int(b) for b in batch_ids]}
        if member:
            body["member"] = member
        if policy_version is not None:
            self.policy_version = body["policy_version"] = int(policy_version)
        return self._action("ack", body)

    def set_policy_version(self, version: int) -> None:
        """Report the trainer's policy version: groups staler than the server's
        --max-staleness are skipped from now on."""
        self.policy_version = int(version)
        if self.consumer is not None and self._reader is not None:
            self._action("set_policy_version", {"consumer": self.consumer, "key": self._key, "policy_version": self.policy_version})

    def publish_version(self, version: int) -> None:
        """Say that the inference workers now serve policy ``version`` (call it
        once they loaded the new weights). It is recorded in the store, where
        ``rllm-pipe gateway`` follows it and stamps new calls with it; it is
        this trainer's policy version from now on too. The highest version
        published for the consumer group counts: ranks of one data-parallel
        trainer may all publish the same version. Needs an open stream (call
        it between batches)."""
        if self.consumer is None or self._key is None:
            raise RuntimeError("publish_version needs a stream: iterate batches() first")
        self.policy_version = int(version)
        self._action("publish_policy_version", {"consumer": self.consumer, "key": self._key, "policy_version": self.policy_version})

    def stats(self, consumer: Optional[str] = None) -> Dict[str, Any]:
        """This member's tallies (batches, groups acked, skipped stale, ...),
        also after its stream ended. consumer, another member's name, or "" for
        every streaming member, needs the server's admin token."""
        if consumer is None:
            return self._action("stats", {"consumer": self.consumer, "key": self._key})
        return self._action("stats", {"consumer": consumer} if consumer else {})

    def close(self) -> None:
        """Ends the stream (its unacknowledged batches go back to the group) and closes the connection."""
        self._cancel()
        self._flight.close()
