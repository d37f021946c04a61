"""Padded tensors in verl's layout from a batch of rows (``Batch.to_padded``).

The rows are the merged trajectory rows of ``rllm-pipe serve --layout
trajectories`` (prompt, then a response of actions and observations with
``response_mask``, ``rollout_log_probs`` and per-token ``advantages``), or
step rows (``--layout steps``: every response token is an action, advantages
are ``token_advantages`` where present, else the step's ``advantage``).

The layout is the one rLLM's verl backend builds
(``rllm/trainer/verl/transform.py``, ``_batch_tensors_and_build_data_proto``):

- ``prompts``: left-padded to ``max_prompt_length``; a longer prompt keeps its
  end. ``responses``: right-padded to ``max_response_length``; a longer
  response keeps its start. ``input_ids`` = prompts ++ responses.
- ``attention_mask``: 1 on tokens, 0 on padding. By default, as rLLM does,
  every position holding ``pad_token_id`` is masked (a real token equal to the
  pad id too: the count is reported as ``pad_id_tokens``);
  ``mask_pad_token_ids=False`` masks only the padding itself.
- ``position_ids`` = (cumsum(attention_mask) - 1) * attention_mask.
- ``response_mask``, ``rollout_log_probs`` padded with 0; ``advantages`` =
  per-token advantages * response_mask; ``traj_rewards`` holds the row's
  reward at its last response token (when the response fits, as rLLM).
- Rows added to reach a multiple of ``pad_rows_to_multiple`` (the
  data-parallel world size) are all padding with ``is_pad`` True.

Truncation is never silent: rows cut and tokens dropped are counted in
``Padded.truncation`` (and per row in ``prompt_truncated`` /
``response_truncated``), and a warning is issued.

Only numpy is needed; ``Padded.torch()`` gives torch tensors sharing the
numpy arrays' memory when torch is installed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import numpy as np
import pyarrow as pa

# The tensors of Padded, in verl's names.
TENSORS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "prompts",
    "responses",
    "response_mask",
    "rollout_log_probs",
    "advantages",
    "traj_rewards",
)


class TruncationWarning(UserWarning):
    """Rows were cut to max_prompt_length / max_response_length."""


@dataclass
class Padded:
    input_ids: np.ndarray  # int64 [rows, P + R]
    attention_mask: np.ndarray  # int64 [rows, P + R]
    position_ids: np.ndarray  # int64 [rows, P + R]
    prompts: np.ndarray  # int64 [rows, P]
    responses: np.ndarray  # int64 [rows, R]
    response_mask: np.ndarray  # int64 [rows, R]
    rollout_log_probs: np.ndarray  # float32 [rows, R]
    advantages: np.ndarray  # float32 [rows, R], masked
    traj_rewards: np.ndarray  # float32 [rows, R]
    is_pad: np.ndarray  # bool [rows]: rows added by pad_rows_to_multiple
    prompt_truncated: np.ndarray  # bool [rows]
    response_truncated: np.ndarray  # bool [rows]
    # Per-row ids and values (numpy arrays of the batch's columns, padded rows
    # get "" / 0 / False): group_ids, trajectory_ids, first_step_ids, ...
    ids: Dict[str, np.ndarray]
    # Counts: rows, pad_rows, prompts_truncated, prompt_tokens_dropped,
    # responses_truncated, response_tokens_dropped, action_tokens_dropped,
    # pad_id_tokens.
    truncation: Dict[str, int]
    old_log_probs: Optional[np.ndarray] = None  # float32 [rows, R], when the rows carry them
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def arrays(self) -> Dict[str, np.ndarray]:
        """The tensors by name (numpy), old_log_probs when present."""
        out = {name: getattr(self, name) for name in TENSORS}
        if self.old_log_probs is not None:
            out["old_log_probs"] = self.old_log_probs
        return out

    def torch(self) -> Dict[str, Any]:
        """The tensors as torch tensors sharing the numpy arrays' memory
        (torch must be installed), plus is_pad as a bool tensor."""
        import torch

        out = {name: torch.from_numpy(a) for name, a in self.arrays().items()}
        out["is_pad"] = torch.from_numpy(self.is_pad)
        return out


def _list(record: pa.RecordBatch, name: str):
    """values and absolute offsets of list column name (no copy)."""
    arr = record.column(record.schema.get_field_index(name))
    if arr.null_count:
        raise ValueError(f"{name} has null rows")
    return arr.values.to_numpy(zero_copy_only=False), arr.offsets.to_numpy(zero_copy_only=False)


def _has(record: pa.RecordBatch, name: str) -> bool:
    return record.schema.get_field_index(name) >= 0


def _column(record: pa.RecordBatch, name: str) -> pa.Array:
    return record.column(record.schema.get_field_index(name))


# The per-row ids: the output name, the column of merged rows, the column of
# step rows (None: not in that layout).
_IDS = (
    ("group_ids", "group_id", "group_id"),
    ("task_ids", "task_id", "task_id"),
    ("trajectory_ids", "trajectory_id", "trajectory_id"),
    ("first_step_ids", "first_step_id", "step_id"),
    ("last_step_ids", "last_step_id", "step_id"),
    ("first_step_index", "first_step_index", "step_index"),
    ("last_step_index", "last_step_index", "step_index"),
    ("steps_merged", "steps_merged", None),
    ("segment", "segment", None),
    ("rows_in_trajectory", "rows_in_trajectory", None),
    ("is_last_step", "is_last", None),
    ("policy_versions", "policy_version", "policy_version"),
    ("group_versions", "group_version", "group_version"),
    ("roles", "role", "role"),
    ("rewards", "reward", "reward"),
    ("is_correct", "is_correct", "is_correct"),
    ("termination_reasons", "termination_reason", "termination_reason"),
)


def _pad_ids(values: np.ndarray, n_pad: int) -> np.ndarray:
    if n_pad == 0:
        return values
    if values.dtype == object:
        return np.concatenate([values, np.array([None] * n_pad, dtype=object)])
    return np.concatenate([values, np.zeros(n_pad, dtype=values.dtype)])


def _scatter(n: int, lengths: np.ndarray, keep: np.ndarray, starts: np.ndarray, dst_starts: np.ndarray):
    """Flat (row, destination column, source index) of the kept tokens: row i
    keeps keep[i] tokens from source index starts[i], placed from column
    dst_starts[i]."""
    total = int(keep.sum())
    rows = np.repeat(np.arange(n), keep)
    within = np.arange(total) - np.repeat(np.cumsum(keep) - keep, keep)
    return rows, np.repeat(dst_starts, keep) + within, np.repeat(starts, keep) + within


def to_padded(
    record: pa.RecordBatch,
    pad_token_id: int,
    max_prompt_length: int,
    max_response_length: int,
    pad_rows_to_multiple: int = 1,
    mask_pad_token_ids: bool = True,
    warn: bool = True,
) -> Padded:
    """Pads the rows of record (merged trajectory rows or step rows) in
    verl's layout; see the module's documentation."""
    if max_prompt_length < 1 or max_response_length < 1:
        raise ValueError("max_prompt_length and max_response_length must be >= 1")
    if pad_rows_to_multiple < 1:
        raise ValueError("pad_rows_to_multiple must be >= 1")
    merged = _has(record, "response_mask")
    n = record.num_rows
    total_rows = -(-n // pad_rows_to_multiple) * pad_rows_to_multiple if n else 0
    n_pad = total_rows - n
    P, R = int(max_prompt_length), int(max_response_length)

    pv, po = _list(record, "prompt_ids")
    rv, ro = _list(record, "response_ids")
    plen, rlen = np.diff(po), np.diff(ro)
    pkeep, rkeep = np.minimum(plen, P), np.minimum(rlen, R)

    prompts = np.full((total_rows, P), pad_token_id, dtype=np.int64)
    rows, cols, src = _scatter(n, plen, pkeep, po[1:] - pkeep, P - pkeep)
    prompts[rows, cols] = pv[src]

    responses = np.full((total_rows, R), pad_token_id, dtype=np.int64)
    rrows, rcols, rsrc = _scatter(n, rlen, rkeep, ro[:-1], np.zeros(n, dtype=np.int64))
    responses[rrows, rcols] = rv[rsrc]
    roff = rsrc - np.repeat(ro[:-1], rkeep)  # the kept tokens' index within their row's response

    def response_tensor(values: np.ndarray, offsets: np.ndarray, dtype) -> np.ndarray:
        if not np.array_equal(np.diff(offsets), rlen):
            raise ValueError("a response column's lengths differ from response_ids'")
        out = np.zeros((total_rows, R), dtype=dtype)
        out[rrows, rcols] = values[np.repeat(offsets[:-1], rkeep) + roff]
        return out

    response_mask = np.zeros((total_rows, R), dtype=np.int64)
    if merged:
        mv, mo = _list(record, "response_mask")
        response_mask = response_tensor(mv, mo, np.int64)
        lv, lo = _list(record, "rollout_log_probs")
        av, ao = _list(record, "advantages")
        full_mask = mv[mo[0] : mo[-1]] if len(mo) else mv
        action_total = int(np.count_nonzero(full_mask))
    else:
        response_mask[rrows, rcols] = 1
        lv, lo = _list(record, "response_logprobs")
        adv = _column(record, "advantage").to_numpy(zero_copy_only=False).astype(np.float32)
        tok = _column(record, "token_advantages") if _has(record, "token_advantages") else None
        av = np.repeat(adv, rlen)  # scalar advantage on every token ...
        if tok is not None and tok.null_count < len(tok):
            # ... or the step's token advantages, where it has them
            ta = tok.values.to_numpy(zero_copy_only=False)
            to = tok.offsets.to_numpy(zero_copy_only=False)
            valid = ~np.asarray(tok.is_null().to_numpy(zero_copy_only=False))
            starts = np.cumsum(rlen) - rlen
            for i in np.nonzero(valid)[0]:
                av[starts[i] : starts[i] + rlen[i]] = ta[to[i] : to[i + 1]]
        ao = np.concatenate([[0], np.cumsum(rlen)])
        action_total = int(rlen.sum())
    rollout_log_probs = response_tensor(lv, lo, np.float32)
    advantages = response_tensor(av, ao, np.float32) * response_mask
    old_log_probs = None
    if _has(record, "old_log_probs"):
        ov, oo = _list(record, "old_log_probs")
        old_log_probs = response_tensor(ov, oo, np.float32)

    input_ids = np.concatenate([prompts, responses], axis=1)
    if mask_pad_token_ids:
        attention_mask = (input_ids != pad_token_id).astype(np.int64)
    else:
        attention_mask = np.zeros_like(input_ids)
        attention_mask[rows, cols] = 1
        attention_mask[rrows, P + rcols] = 1
    position_ids = (np.cumsum(attention_mask, axis=1) - 1) * attention_mask

    traj_rewards = np.zeros((total_rows, R), dtype=np.float32)
    reward = _column(record, "reward").to_numpy(zero_copy_only=False).astype(np.float32)
    fits = (rlen > 0) & (rlen <= R)
    traj_rewards[np.nonzero(fits)[0], rlen[fits] - 1] = reward[fits]

    is_pad = np.zeros(total_rows, dtype=bool)
    is_pad[n:] = True
    prompt_truncated = np.zeros(total_rows, dtype=bool)
    prompt_truncated[:n] = plen > P
    response_truncated = np.zeros(total_rows, dtype=bool)
    response_truncated[:n] = rlen > R
    pad_id_tokens = int(np.count_nonzero(pv[src] == pad_token_id)) + int(np.count_nonzero(rv[rsrc] == pad_token_id))
    truncation = {
        "rows": n,
        "pad_rows": n_pad,
        "prompts_truncated": int(np.count_nonzero(plen > P)),
        "prompt_tokens_dropped": int((plen - pkeep).sum()),
        "responses_truncated": int(np.count_nonzero(rlen > R)),
        "response_tokens_dropped": int((rlen - rkeep).sum()),
        "action_tokens_dropped": action_total - int(response_mask.sum()),
        "pad_id_tokens": pad_id_tokens,
    }
    if warn and (truncation["prompts_truncated"] or truncation["responses_truncated"]):
        warnings.warn(
            f"to_padded: {truncation['prompts_truncated']} prompts and {truncation['responses_truncated']} responses "
            f"of {n} rows cut to {P}/{R} tokens ({truncation['prompt_tokens_dropped']} prompt, "
            f"{truncation['response_tokens_dropped']} response tokens dropped, {truncation['action_tokens_dropped']} of them actions)",
            TruncationWarning,
            stacklevel=3,
        )

    ids: Dict[str, np.ndarray] = {}
    for out_name, merged_col, step_col in _IDS:
        name = merged_col if merged else step_col
        if name is None or not _has(record, name):
            continue
        arr = _column(record, name)
        if pa.types.is_string(arr.type) or arr.null_count:
            values = np.array(arr.to_pylist(), dtype=object)
        else:
            values = arr.to_numpy(zero_copy_only=False)
        ids[out_name] = _pad_ids(values, n_pad)
    return Padded(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        prompts=prompts,
        responses=responses,
        response_mask=response_mask,
        rollout_log_probs=rollout_log_probs,
        advantages=advantages,
        traj_rewards=traj_rewards,
        is_pad=is_pad,
        prompt_truncated=prompt_truncated,
        response_truncated=response_truncated,
        ids=ids,
        truncation=truncation,
        old_log_probs=old_log_probs,
    )
