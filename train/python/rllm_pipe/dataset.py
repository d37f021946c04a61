"""A PyTorch-style iterable dataset over a consumer group of ``rllm-pipe
serve``: it yields padded batches (``Batch.to_padded``) and acknowledges a
batch only when the trainer says its optimizer step is done. Here
``location`` is the address of ``rllm-pipe serve --layout trajectories
--follow=false`` (see ``rllm_pipe``):

    >>> from rllm_pipe.dataset import PaddedBatches
    >>> data = PaddedBatches(location, consumer="trainer-0", pad_token_id=0,
    ...                      max_prompt_length=2048, max_response_length=8192)
    >>> for step in data:
    ...     with step:                         # acknowledged when the block ends without an exception
    ...         arrays = step.padded.arrays()  # numpy, in verl's names; step.padded.torch() for torch
    ...         # the loss on arrays["input_ids"], ...; backward; optimizer.step()
    ...     assert data.policy_version == step.policy_version + 1  # the version the acknowledgement reported
    >>> data.policy_version, data.stats["groups_acked"]
    (8, 8)

Each optimizer step makes new weights, so an acknowledgement advances
``policy_version`` by ``versions_per_step`` (1) and reports the advanced
version: the version of the weights that will train on the next step.
The dataset tells ``serve`` its ``versions_per_step``, and the server
judges every step it forms at the version it will train with (the version
now plus ``versions_per_step`` for each step handed out ahead of it, up to
``--max-inflight``), so ``--max-staleness`` bounds the staleness of every
row as trained on, and ``step.staleness`` agrees with the server's
judgement. Reporting the version from before the step would let the next
step be one version staler than the bound. A trainer that numbers its
versions otherwise (weights published every k steps) passes
``versions_per_step=0`` and sets ``policy_version`` (or calls
``step.ack(policy_version=v)``) itself; the bound then holds at the
version it reports.

An acknowledgement settles the batch's groups for the whole consumer group;
a batch not acknowledged (the block raised, the loop stopped, the process
died) goes back to the group and is delivered again. Taking the next batch
before acknowledging the previous one is refused (``UnackedBatch``), so no
batch is acknowledged before it was trained on, nor forgotten.

When torch is installed ``PaddedBatches`` is a ``torch.utils.data.
IterableDataset``; use it with ``batch_size=None`` and no worker processes (a
consumer is one stream), or iterate it directly.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Deque, Dict, Iterator, List, Optional, Type, cast

import numpy as np

from .client import Batch, Client
from .padded import Padded

try:  # torch is optional
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # pragma: no cover - exercised without torch
    _Base = object


class UnackedBatch(RuntimeError):
    """The next batch was asked for before the previous one was acknowledged."""


@dataclass
class TrainingStep:
    """One optimizer step's data, padded; acknowledge it after the optimizer
    step (``ack()``, or leave a ``with`` block without an exception).

    A step is one batch, unless ``serve --batch-groups N --max-tokens T``
    split its N groups into several batches of whole groups within T tokens:
    then ``micro_batches`` holds one padded batch per part, to accumulate
    gradients over, and ``padded`` refuses (it would be only a part)."""

    micro_batches: List[Padded]
    batches: List[Batch]
    policy_version: int  # the version of the weights the step was handed out to (and trains)
    _dataset: "PaddedBatches" = field(repr=False)
    ack_result: Optional[Dict[str, int]] = None

    @property
    def padded(self) -> Padded:
        """The step's padded batch (a step that came as one batch)."""
        if len(self.micro_batches) != 1:
            raise ValueError(
                f"this step came as {len(self.micro_batches)} micro-batches (serve's --max-tokens split its "
                f"--batch-groups groups): train on each of step.micro_batches before the optimizer step"
            )
        return self.micro_batches[0]

    @property
    def batch(self) -> Batch:
        """The step's batch (a step that came as one batch)."""
        if len(self.batches) != 1:
            raise ValueError(f"this step came as {len(self.batches)} batches: see step.batches")
        return self.batches[0]

    @property
    def groups(self) -> List[str]:
        """The step's groups, in order (every part's)."""
        return [g for b in self.batches for g in b.groups]

    @property
    def acked(self) -> bool:
        return self.ack_result is not None

    @property
    def batch_id(self) -> int:
        return self.batches[0].batch_id

    @property
    def batch_ids(self) -> List[int]:
        return [b.batch_id for b in self.batches]

    @property
    def staleness(self) -> Dict[str, float]:
        """How many versions behind the trainer the rows were generated:
        policy_version minus each row's (smallest) policy version, over every
        micro-batch."""
        parts = [np.asarray(p.ids["policy_versions"][~p.is_pad], dtype=np.int64) for p in self.micro_batches if p.ids.get("policy_versions") is not None]
        real = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if real.size == 0:
            return {"max": 0, "mean": 0.0}
        behind = np.maximum(self.policy_version - real, 0)
        return {"max": int(behind.max()), "mean": float(behind.mean())}

    def ack(self, policy_version: Optional[int] = None) -> Dict[str, int]:
        """Acknowledge the step (every batch of it) after its optimizer step,
        reporting the version of the weights that step made: policy_version,
        by default the dataset's policy_version advanced by its
        versions_per_step. The reported version becomes the dataset's.
        Repeating returns the first answer."""
        if self.ack_result is None:
            d = self._dataset
            v = d.policy_version + d.versions_per_step if policy_version is None else int(policy_version)
            self._dataset.policy_version = v
            self.ack_result = cast(Client, d.client).ack(self.batch_ids, policy_version=v, member=self.batches[0].meta.get("member"))
            for b in self.batches:
                b.acked = True
            self._dataset._pending = None
        return self.ack_result

    def __enter__(self) -> "TrainingStep":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if exc_type is None:
            self.ack()
        # On an exception the step stays unacknowledged: the stream ends with
        # the iteration and its batches go back to the group.


class PaddedBatches(_Base):
    """Padded batches of a consumer group, acknowledged after each optimizer
    step. Keyword arguments beyond the padding ones go to ``Client`` (token,
    tls_root_certs, ...).

    reuse_arrays: each step's arrays are written into the previous step's
    (``to_padded(out=...)``) instead of new memory, so a step's arrays and
    torch views are valid only until the next step is taken; for a trainer
    that copies every batch to its device. Saves allocating (and the kernel
    zeroing) a few hundred MB per batch of 512 rows of 10k tokens.

    policy_version: the version of the weights that train on the first
    batch. versions_per_step: how far each acknowledged optimizer step
    advances it (the advanced version goes with the acknowledgement); 0 to
    manage policy_version yourself.

    batch_groups: exactly this many groups (prompts) per step, waited for
    (this member's ``serve --batch-groups``; a multiple of the server's
    --group-multiple). None: the server's setting."""

    def __init__(
        self,
        location: str,
        consumer: Optional[str] = None,
        *,
        pad_token_id: int,
        max_prompt_length: int,
        max_response_length: int,
        pad_rows_to_multiple: int = 1,
        policy_version: int = 0,
        versions_per_step: int = 1,
        max_batches: Optional[int] = None,
        padding: Optional[Dict[str, Any]] = None,
        reuse_arrays: bool = False,
        batch_groups: Optional[int] = None,
        **client_kwargs: Any,
    ) -> None:
        super().__init__()
        self.location = location
        self.consumer = consumer
        self.pad_token_id = pad_token_id
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length
        self.pad_rows_to_multiple = pad_rows_to_multiple
        self.policy_version = int(policy_version)
        if versions_per_step < 0:
            raise ValueError("versions_per_step must be >= 0")
        self.versions_per_step = int(versions_per_step)
        self.max_batches = max_batches
        self.padding = dict(padding or {})
        self.reuse_arrays = reuse_arrays
        if batch_groups is not None and batch_groups < 1:
            raise ValueError("batch_groups must be >= 1")
        self.batch_groups = batch_groups
        self.client_kwargs = client_kwargs
        self.client: Optional[Client] = None
        self._pending: Optional[TrainingStep] = None
        # Tallies of this dataset's iterations.
        self.stats: Dict[str, Any] = {"batches": 0, "acked": 0, "groups_acked": 0, "groups_lost": 0, "rows": 0, "truncated_rows": 0,
                                      "wait_s": 0.0, "wall_s": 0.0, "first_wait_s": 0.0, "staleness_max": 0,
                                      "micro_batches": 0}
        # Ages (ms) of the groups delivered: finished at the gateway ->
        # delivered; the newest 100,000.
        self._ages: Deque[int] = deque(maxlen=100_000)

    def __iter__(self) -> Iterator[TrainingStep]:
        # The server judges staleness with this dataset's versions_per_step,
        # so step.staleness and its judgement agree by construction.
        with Client(self.location, consumer=self.consumer, policy_version=self.policy_version, batch_groups=self.batch_groups,
                    versions_per_step=self.versions_per_step, **self.client_kwargs) as client:
            self.client = client
            previous: Optional[Padded] = None
            started = asked = time.monotonic()
            parts: List[Batch] = []
            try:
                for batch in client.batches():
                    parts.append(batch)
                    if not batch.last_part:
                        continue  # the rest of the step follows at once
                    now = time.monotonic()
                    if self.stats["batches"] == 0:
                        self.stats["first_wait_s"] += now - asked
                    self.stats["wait_s"] += now - asked
                    self.stats["wall_s"] += now - started
                    started = now
                    if self.max_batches is not None and self.stats["batches"] >= self.max_batches:
                        return
                    micro = []
                    for i, b in enumerate(parts):
                        self._ages.extend(a for a in b.meta.get("ages_ms") or () if a >= 0)
                        micro.append(b.to_padded(
                            self.pad_token_id, self.max_prompt_length, self.max_response_length, self.pad_rows_to_multiple,
                            out=previous if i == 0 else None, **self.padding
                        ))
                    if self.reuse_arrays and len(micro) == 1:
                        previous = micro[0]
                    step = TrainingStep(micro_batches=micro, batches=parts, policy_version=self.policy_version, _dataset=self)
                    parts = []
                    self._pending = step
                    self.stats["batches"] += 1
                    self.stats["micro_batches"] += len(micro)
                    for p in micro:
                        self.stats["rows"] += p.truncation["rows"]
                        self.stats["truncated_rows"] += int(np.count_nonzero(p.prompt_truncated | p.response_truncated))
                    self.stats["staleness_max"] = max(self.stats["staleness_max"], step.staleness["max"])
                    yield step
                    asked = time.monotonic()
                    if not step.acked:
                        raise UnackedBatch(
                            f"step of batch {step.batch_id} was not acknowledged: call step.ack() (or use `with step:`) "
                            "after the optimizer step, before taking the next one"
                        )
                    self.stats["acked"] += 1
                    res = step.ack_result or {}  # set: the step is acknowledged
                    self.stats["groups_acked"] += int(res.get("groups", 0))
                    self.stats["groups_lost"] += int(res.get("lost", 0))
            finally:
                self.consumer = client.consumer
                self.client = None

    @property
    def stall(self) -> float:
        """Trainer data stall: the share of the iteration's wall time spent
        waiting for the next batch (0 to 1)."""
        return self.stats["wait_s"] / self.stats["wall_s"] if self.stats["wall_s"] > 0 else 0.0

    def freshness(self) -> Dict[str, float]:
        """How long after their last trajectory finished at the capture
        gateway the groups were delivered: groups counted, p50, p99 and max
        in milliseconds (groups not captured by the gateway are not
        counted)."""
        if not self._ages:
            return {"groups": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        a = np.fromiter(self._ages, dtype=np.float64)
        p50, p99 = np.percentile(a, [50, 99])
        return {"groups": int(a.size), "p50_ms": float(p50), "p99_ms": float(p99), "max_ms": float(a.max())}

    def loop_stats(self) -> Dict[str, Any]:
        """What an async RL run watches: stall, freshness, the largest
        staleness trained on, and the groups the server skipped as stale
        (asked of the server while a stream is open)."""
        st = self.stats
        steady = st["wall_s"] - st["first_wait_s"]
        out: Dict[str, Any] = {"stall": self.stall, "freshness": self.freshness(), "staleness_max": st["staleness_max"], "batches": st["batches"],
                               # after the first batch: without the wait for the pipe to fill
                               "stall_steady": (st["wait_s"] - st["first_wait_s"]) / steady if steady > 0 else 0.0}
        if self.client is not None:
            try:
                out["groups_skipped_stale"] = int((self.client.stats() or {}).get("groups_skipped_stale", 0))
            except Exception:  # the stream ended: the tallies above stand
                pass
        return out

    def publish_version(self, version: int) -> None:
        """Say that the inference workers now serve policy ``version``
        (``Client.publish_version``): the capture gateway stamps new calls with
        it. Call it after the step's acknowledgement, once the workers loaded
        the weights."""
        if self.client is None:
            raise RuntimeError("publish_version needs the iteration running (between steps)")
        self.policy_version = int(version)
        self.client.publish_version(self.policy_version)

    def set_policy_version(self, version: int) -> None:
        """Report the trainer's policy version now (staleness of the batches
        formed from now on); it is also reported with every acknowledgement."""
        self.policy_version = int(version)
        if self.client is not None:
            self.client.set_policy_version(self.policy_version)
