"""Reading rllm-pipe shards directly with pyarrow.

Since schema 4 a multi-turn step whose prompt begins with its predecessor's
prompt and response stores only the tokens after them (``prompt_ids`` is
null, ``prompt_prefix_len`` says how many tokens are reused,
``prompt_delta_ids`` holds the rest), and its chat messages likewise
(``messages`` null, ``messages_delta`` the JSON text after the
predecessor's closing bracket). The predecessor is always the row just
before it in the same shard. ``read_shard`` gives every row its whole
prompt and messages back; ``serve``/``Client``, ``sql`` and ``export``
already do this for you.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Union

import pyarrow as pa
import pyarrow.parquet as pq

_NEEDS = ["trajectory_id", "step_index", "prompt_ids", "response_ids", "prompt_prefix_len", "prompt_delta_ids", "messages", "messages_delta"]


def whole_prompts(table: pa.Table) -> pa.Table:
    """Return ``table`` (rows of one shard, in shard order) with whole
    ``prompt_ids`` and ``messages``."""
    names = table.column_names
    if "prompt_prefix_len" not in names:
        return table  # schema 3: every prompt is whole
    if "prompt_ids" not in names and "messages" not in names:
        return table  # neither asked for: the delta columns as stored
    cols = {n: table.column(n).to_pylist() for n in _NEEDS if n in names}
    prompts, messages = [], []
    prev: Any = None  # (trajectory, step, whole prompt, response, whole messages)
    for i in range(table.num_rows):
        traj, step = cols["trajectory_id"][i], cols["step_index"][i]
        follows = prev is not None and prev[0] == traj and prev[1] + 1 == step
        p = cols["prompt_prefix_len"][i]
        if p:
            if not follows or p != len(prev[2]) + len(prev[3]):
                raise ValueError(f"row {i} ({traj} step {step}): its predecessor is not the row before it")
            prompt = prev[2] + prev[3] + cols["prompt_delta_ids"][i]
        else:
            prompt = cols["prompt_ids"][i]
        msgs = None
        if "messages" in cols:
            delta = cols.get("messages_delta", [None] * table.num_rows)[i]
            if delta is not None:
                if not follows or not prev[4]:
                    raise ValueError(f"row {i} ({traj} step {step}): messages extend a missing predecessor")
                msgs = prev[4][:-1] + delta
            else:
                msgs = cols["messages"][i]
        prompts.append(prompt)
        messages.append(msgs)
        prev = (traj, step, prompt, cols["response_ids"][i], msgs)
    out = table.set_column(names.index("prompt_ids"), table.schema.field("prompt_ids"), pa.array(prompts, type=table.schema.field("prompt_ids").type))
    if "messages" in cols:
        field = out.schema.field("messages")  # string, or large_string from pyiceberg
        out = out.set_column(names.index("messages"), field, pa.array(messages, type=field.type))
    return out


def read_shard(path: Union[str, os.PathLike[str]], columns: Optional[Iterable[str]] = None) -> pa.Table:
    """Read a shard file as a pyarrow Table with whole prompts and
    messages (all columns when ``columns`` is None)."""
    schema = pq.read_schema(path)
    want = list(columns) if columns else None
    read = want
    if want is not None and "prompt_prefix_len" in schema.names and {"prompt_ids", "messages"} & set(want):
        read = want + [n for n in _NEEDS if n not in want and n in schema.names]
    table = whole_prompts(pq.read_table(path, columns=read))
    return table.select(want) if want is not None else table
