"""rllm_pipe: the trainer side of rllm-pipe.

Connect to ``rllm-pipe serve``, iterate token-budget batches of whole
groups (Arrow record batches), acknowledge them once trained on, and report
the trainer's policy version so stale groups are skipped. Here ``location``
is the server's address: ``"grpc://127.0.0.1:8815"`` for ``rllm-pipe serve
--from data --listen 127.0.0.1:8815 --follow=false`` (without
``--follow=false`` the stream waits for new shards instead of ending):

    >>> from rllm_pipe import Client
    >>> groups = 0
    >>> with Client(location, consumer="trainer-0", policy_version=0) as client:
    ...     for batch in client.batches():                  # whole groups within serve's --max-tokens
    ...         resp = batch.tokens("response_ids")         # numpy views of the Arrow buffers, no copy
    ...         adv = batch.column("advantage").to_numpy()  # one per row (a step)
    ...         first = resp.row(0)                         # resp.values[resp.offsets[0]:resp.offsets[1]]
    ...         # train on resp.values, resp.offsets and adv: one optimizer step, one new policy version
    ...         groups += batch.ack(policy_version=client.policy_version + 1)["groups"]
    >>> groups, client.policy_version  # every group acknowledged once, a version per step
    (8, 8)

``rllm_pipe.dataset.PaddedBatches`` does the same with padded batches in
verl's layout (``Batch.to_padded``), and ``rllm_pipe.verl`` turns those into
verl's ``DataProto``.

Workers that hold rLLM Episodes send them in with ``rllm_pipe.emit``
(``episode_records``, then ``post_records`` to the capture gateway or
``write_records`` to a file for ``rllm-pipe ingest``).

Reading shard files directly: ``rllm_pipe.shards.read_shard`` gives multi-turn
steps their whole prompts back (schema 4 stores them as prefix deltas).

pyarrow and numpy are required (recent pyarrow releases no longer bring
numpy); torch is used when installed (``Batch.tensors``, ``Padded.torch``).
"""

# The package's version: pyproject.toml reads it from here (without importing
# the package), and `rllm-pipe version --json` reports the same.
__version__ = "0.1.0"

from . import emit, shards  # noqa: E402
from .client import Batch, Client, TokenColumn  # noqa: E402
from .dataset import PaddedBatches, UnackedBatch  # noqa: E402
from .emit import episode_records, post_records, write_records  # noqa: E402

__all__ = ["Batch", "Client", "PaddedBatches", "TokenColumn", "UnackedBatch", "emit", "episode_records", "post_records", "shards",
           "write_records"]
