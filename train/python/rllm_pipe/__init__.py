"""rllm_pipe: the trainer side of rllm-pipe.

Connect to ``rllm-pipe serve``, iterate token-budget batches of whole
groups (Arrow record batches), acknowledge them once trained on, and report
the trainer's policy version so stale groups are skipped::

    from rllm_pipe import Client

    with Client("grpc://127.0.0.1:8815", consumer="trainer-0", policy_version=0) as client:
        for batch in client.batches():
            ids, offsets = batch.tokens("response_ids")   # numpy views, no copy
            ...                                           # train on the batch
            batch.ack()
            client.set_policy_version(new_version)

Workers that hold rLLM Episodes send them in with ``rllm_pipe.emit``
(``episode_records``, then ``post_records`` to the capture gateway or
``write_records`` to a file for ``rllm-pipe ingest``).

Reading shard files directly: ``rllm_pipe.shards.read_shard`` gives multi-turn
steps their whole prompts back (schema 4 stores them as prefix deltas).

pyarrow and numpy are required (recent pyarrow releases no longer bring
numpy); torch is used when installed (``Batch.tensors``).
"""

from . import emit, shards
from .client import Batch, Client, TokenColumn
from .dataset import PaddedBatches, UnackedBatch
from .emit import episode_records, post_records, write_records

__all__ = ["Batch", "Client", "PaddedBatches", "TokenColumn", "UnackedBatch", "emit", "episode_records", "post_records", "shards",
           "write_records"]
__version__ = "0.1.0"
