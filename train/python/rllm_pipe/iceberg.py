"""Reading the Iceberg steps table that ``rllm-pipe iceberg sync`` keeps,
with pyiceberg and pyarrow (``pip install "pyiceberg[sql-sqlite]"``).

The table lists the shards as they are, so a multi-turn step stored as a
prefix delta has a null ``prompt_ids`` there (see ``rllm_pipe.shards``).
``read_steps`` scans the table and gives every row its whole prompt and
messages back, as ``rllm-pipe sql``'s ``steps`` view does. After
``rllm-pipe iceberg sync --from data --catalog lake/catalog.db``:

    >>> from pyiceberg.catalog.sql import SqlCatalog
    >>> from rllm_pipe.iceberg import read_steps
    >>> table = SqlCatalog("rllm", uri="sqlite:///lake/catalog.db").load_table("rllm.steps")
    >>> steps = read_steps(table, row_filter="group_version >= 1")   # a pyarrow Table
    >>> sorted(set(steps.column("group_version").to_pylist()))
    [1]
    >>> steps.column("prompt_ids").null_count   # every prompt whole (the table's deltas are null there)
    0

Spark reads the table through Iceberg's JDBC catalog on the same SQLite
file; ``SPARK_WHOLE_PROMPTS_SQL`` rebuilds the whole prompts there.

A filter must keep whole trajectories (filter on group, trajectory or
version columns, not on step columns), or a delta row loses the rows it
extends.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

import pyarrow as pa

from .shards import whole_prompts

SPARK_WHOLE_PROMPTS_SQL = """\
WITH numbered AS (
  SELECT group_id, group_version, trajectory_id, step_index, prompt_prefix_len, prompt_ids, prompt_delta_ids,
    sum(CASE WHEN coalesce(prompt_prefix_len, 0) = 0 THEN 1 ELSE 0 END) OVER (
      PARTITION BY group_id, group_version, trajectory_id ORDER BY step_index
      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS segment,
    lag(response_ids) OVER (
      PARTITION BY group_id, group_version, trajectory_id ORDER BY step_index) AS prev_response_ids
  FROM {table}
), pieces AS (
  SELECT *,
    CASE WHEN coalesce(prompt_prefix_len, 0) = 0 THEN prompt_ids
         ELSE concat(prev_response_ids, prompt_delta_ids) END AS piece
  FROM numbered
)
SELECT group_id, group_version, trajectory_id, step_index,
  flatten(collect_list(piece) OVER (
    PARTITION BY group_id, group_version, trajectory_id, segment ORDER BY step_index
    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)) AS prompt_ids
FROM pieces"""
"""Spark SQL (``.format(table="rllm.rllm.steps")``) giving every step its
whole ``prompt_ids``, keyed by group_id, group_version, trajectory_id and
step_index (join it back for the other columns), with window functions
only: within a trajectory ordered by step, a segment starts at each whole
row (``prompt_prefix_len`` 0 or null); a row's piece is its ``prompt_ids``
if whole, else the previous step's ``response_ids`` then its
``prompt_delta_ids``; its whole prompt is its segment's pieces up to and
including its own, flattened (``collect_list`` over an ordered ROWS frame
keeps their order). Filter the table on whole trajectories only, as for
``read_steps``."""

_ORDER = [("group_id", "ascending"), ("group_version", "ascending"), ("trajectory_id", "ascending"), ("step_index", "ascending")]


def read_steps(table: Any, row_filter: Optional[Any] = None, snapshot_id: Optional[int] = None,
               selected_fields: Iterable[str] = ("*",)) -> pa.Table:
    """Scan a pyiceberg ``Table`` (at ``snapshot_id``, default the
    current snapshot; ``row_filter`` a pyiceberg expression or its string
    form) into a pyarrow Table of whole rows, ordered by group, version,
    trajectory and step."""
    kw: Dict[str, Any] = {"selected_fields": tuple(selected_fields)}
    if row_filter is not None:
        kw["row_filter"] = row_filter
    if snapshot_id is not None:
        kw["snapshot_id"] = snapshot_id
    rows = table.scan(**kw).to_arrow()
    # A delta row's predecessor is the step before it in its trajectory
    # (the shard's row before it): sorting by trajectory and step (a
    # stable sort) puts it there whatever order the files were read in.
    return whole_prompts(rows.sort_by(_ORDER))
