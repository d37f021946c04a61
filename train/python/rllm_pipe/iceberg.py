"""Reading the Iceberg steps table that ``rllm-pipe iceberg sync`` keeps,
with pyiceberg and pyarrow (``pip install "pyiceberg[sql-sqlite]"``).

The table lists the shards as they are, so a multi-turn step stored as a
prefix delta has a null ``prompt_ids`` there (see ``rllm_pipe.shards``).
``read_steps`` scans the table and gives every row its whole prompt and
messages back, as ``rllm-pipe sql``'s ``steps`` view does::

    from pyiceberg.catalog.sql import SqlCatalog
    from rllm_pipe.iceberg import read_steps

    table = SqlCatalog("rllm", uri="sqlite:///lake/catalog.db").load_table("rllm.steps")
    steps = read_steps(table, row_filter="group_version >= 3")

A filter must keep whole trajectories (filter on group, trajectory or
version columns, not on step columns), or a delta row loses the rows it
extends.
"""

from .shards import whole_prompts

_ORDER = [("group_id", "ascending"), ("group_version", "ascending"), ("trajectory_id", "ascending"), ("step_index", "ascending")]


def read_steps(table, row_filter=None, snapshot_id=None, selected_fields=("*",)):
    """Scan a pyiceberg ``Table`` (at ``snapshot_id``, default the
    current snapshot) into a pyarrow Table of whole rows, ordered by
    group, version, trajectory and step."""
    kw = {"selected_fields": tuple(selected_fields)}
    if row_filter is not None:
        kw["row_filter"] = row_filter
    if snapshot_id is not None:
        kw["snapshot_id"] = snapshot_id
    rows = table.scan(**kw).to_arrow()
    # A delta row's predecessor is the step before it in its trajectory
    # (the shard's row before it): sorting by trajectory and step (a
    # stable sort) puts it there whatever order the files were read in.
    return whole_prompts(rows.sort_by(_ORDER))
