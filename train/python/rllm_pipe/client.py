"""Arrow Flight client of ``rllm-pipe serve`` (see train/flight in the Go tree
for the protocol: a JSON ticket, batches with JSON app_metadata, and the
actions ack, set_policy_version and stats)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pyarrow as pa
import pyarrow.flight as flight


@dataclass(frozen=True)
class TokenColumn:
    """A list<int32|float32> column as two flat numpy arrays sharing the Arrow
    buffers: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: Any  # numpy.ndarray, read-only view of the Arrow buffer
    offsets: Any  # numpy.ndarray of int32, len(rows) + 1

    def row(self, i: int):
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def lengths(self):
        return self.offsets[1:] - self.offsets[:-1]


@dataclass
class Batch:
    """Whole groups of rows (one row per step) within the token budget."""

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

    def tensors(self, name: str = "response_ids"):
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

    location: "grpc://host:port" of ``rllm-pipe serve``.
    consumer: the member's stable name (a restart under the same name resumes
    its unfinished shards at once); random when omitted.
    policy_version: the trainer's current policy version, for staleness.
    """

    def __init__(self, location: str, consumer: Optional[str] = None, policy_version: Optional[int] = None, **kwargs):
        self._flight = flight.FlightClient(location, **kwargs)
        self.consumer = consumer
        self.policy_version = policy_version
        self._reader = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def batches(self) -> Iterator[Batch]:
        """Stream batches until the server has nothing more (every committed
        shard done, when it does not follow the manifest) or the iteration is
        abandoned; batches not acknowledged by then go to other members."""
        ticket: Dict[str, Any] = {}
        if self.consumer:
            ticket["consumer"] = self.consumer
        if self.policy_version is not None:
            ticket["policy_version"] = int(self.policy_version)
        self._reader = self._flight.do_get(flight.Ticket(json.dumps(ticket).encode()))
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
        results = list(self._flight.do_action(flight.Action(kind, json.dumps(body).encode())))
        return json.loads(results[0].body.to_pybytes()) if results else None

    def ack(self, batch_ids: List[int], policy_version: Optional[int] = None, member: Optional[str] = None) -> Dict[str, int]:
        """Acknowledge delivered batches by id (reporting policy_version first,
        if given). member, the stream the batches came from (Batch.meta), makes
        the server refuse the ack if that stream has ended."""
        body: Dict[str, Any] = {"consumer": self.consumer, "batch_ids": [int(b) for b in batch_ids]}
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
            self._action("set_policy_version", {"consumer": self.consumer, "policy_version": self.policy_version})

    def stats(self) -> Dict[str, Any]:
        """This member's tallies (batches, groups acked, skipped stale, ...)."""
        return self._action("stats", {"consumer": self.consumer})

    def close(self) -> None:
        self._cancel()
        self._flight.close()
