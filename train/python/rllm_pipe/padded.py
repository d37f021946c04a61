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
  response keeps its start. ``input_ids`` = prompts ++ responses (``prompts``
  and ``responses`` are views of ``input_ids``' columns, not copies).
- ``attention_mask``: 1 on every kept token, 0 on the padding: derived from
  the rows' lengths, as verl's agent loop does, so a real token equal to the
  pad id (any id can be chosen as pad; 0 is common, Qwen's
  ``<|endoftext|>`` is emitted) keeps its attention and position as at
  generation time. verl derives response lengths from this mask: a hole
  would shift every later log-prob. ``mask_pad_token_ids=True`` masks every
  position holding ``pad_token_id`` instead, as rLLM's transform does (the
  real tokens so masked are counted as ``pad_id_tokens`` either way); only
  for reproducing rLLM's batches bit for bit.
- ``position_ids`` = (cumsum(attention_mask) - 1) * attention_mask: 0 on all
  padding, as rLLM (verl's ``compute_position_id_with_mask`` clips at 0
  instead, repeating the last position over the right padding; padding is
  masked either way).
- ``response_mask``, ``rollout_log_probs`` padded with 0; ``advantages`` =
  per-token advantages * response_mask; ``traj_rewards`` holds the row's
  reward at its last response token. A response cut to
  ``max_response_length`` gets none by default, as rLLM
  (``truncated_reward="none"``: its reward is not the cut sequence's);
  ``truncated_reward="last_kept"`` places it on the last kept token, as
  verl's reward managers do with the tokens they see.
  ``step_rewards`` likewise: for merged rows it equals ``traj_rewards``, as
  rLLM's merged transform sets a row's step reward to the trajectory's; for
  step rows it holds the step's ``step_reward`` (0 when the step has none).
- ``response_versions`` (int64 [rows, R]): the policy version that generated
  each response token (the step's ``token_versions``, else its
  ``policy_version``), -1 on observation tokens and padding: the
  denominator's version of an importance ratio, token by token.
- ``old_log_probs`` (float32 [rows, R], padded with 0) when the record has an
  ``old_log_probs`` list column (one item per response token, like
  ``rollout_log_probs``); no rllm-pipe layout carries one yet, so it is None
  unless the caller adds the column.
- Rows added to reach a multiple of ``pad_rows_to_multiple`` (the
  data-parallel world size) are laid out as verl's
  ``pad_dataproto_to_divisor`` does and marked as rLLM's trainer marks them:
  padding row j copies real row j mod n (every token tensor, the rewards
  and per-row ids), then ``response_mask`` and ``advantages`` are zeroed,
  ``is_last_step`` is False, ``is_pad`` True and ``is_valid`` False (rLLM's
  trainer keeps the copied ``traj_rewards`` and ``step_rewards`` too: its
  reward metrics count them). Each padding row thus attends to real tokens (an
  all-masked row gives NaN in an eager softmax and an empty sequence in
  verl's no-padding path) but adds nothing to the loss or its token count.

Truncation is never silent: rows cut and tokens dropped are counted in
``Padded.truncation`` (and per row in ``prompt_truncated`` /
``response_truncated``), and a warning is issued.

Every step is a whole-array numpy operation (no loop over rows or tokens in
Python). ``to_padded(..., out=previous)`` writes into the arrays of an earlier
result the caller is done with instead of allocating new ones.

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
    "step_rewards",
    "response_versions",
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
    step_rewards: np.ndarray  # float32 [rows, R]
    response_versions: np.ndarray  # int64 [rows, R]: -1 off the actions
    is_pad: np.ndarray  # bool [rows]: rows added by pad_rows_to_multiple
    is_valid: np.ndarray  # bool [rows]: not is_pad (rLLM's name)
    prompt_truncated: np.ndarray  # bool [rows]
    response_truncated: np.ndarray  # bool [rows]
    # Per-row ids and values (numpy arrays of the batch's columns; a padding
    # row holds the values of the real row it copies, is_last_step False):
    # group_ids, trajectory_ids, first_step_ids, ...
    ids: Dict[str, np.ndarray]
    # Counts: rows, pad_rows, prompts_truncated, prompt_tokens_dropped,
    # responses_truncated, response_tokens_dropped, action_tokens_dropped,
    # pad_id_tokens.
    truncation: Dict[str, int]
    old_log_probs: Optional[np.ndarray] = None  # float32 [rows, R], when the rows carry them
    extra: Dict[str, Any] = field(default_factory=dict)
    # The arrays by name at their full size, for to_padded(out=...) to reuse.
    _buffers: Dict[str, np.ndarray] = field(default_factory=dict, repr=False)

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
        (torch must be installed), plus is_pad and is_valid as bool tensors."""
        import torch

        out = {name: torch.from_numpy(a) for name, a in self.arrays().items()}
        out["is_pad"] = torch.from_numpy(self.is_pad)
        out["is_valid"] = torch.from_numpy(self.is_valid)
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


def _pad_ids(values: np.ndarray, copied: np.ndarray) -> np.ndarray:
    """values followed by the values of the rows the padding rows copy."""
    if len(copied) == 0:
        return values
    return np.concatenate([values, values[copied]])


def _selection(lengths: np.ndarray, keep: np.ndarray, from_end: bool) -> Optional[np.ndarray]:
    """Which tokens of a list column's flat values are kept: None when every
    row is kept whole, else a mask keeping each row's first (or, from_end,
    last) keep[i] tokens. Every response column shares the one of
    response_ids (their lengths are checked equal)."""
    if np.array_equal(keep, lengths):
        return None
    starts = np.cumsum(lengths) - lengths
    within = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
    if from_end:
        return within >= np.repeat(lengths - keep, lengths)
    return within < np.repeat(keep, lengths)


def _kept(values: np.ndarray, offsets: np.ndarray, selection: Optional[np.ndarray]) -> np.ndarray:
    """The kept tokens of a list column, flat in row order (a slice of the
    Arrow values, no copy, when no row is cut)."""
    flat = values[offsets[0] : offsets[-1]]
    return flat if selection is None else flat[selection]


def _token_advantages(tok: pa.Array, lengths: np.ndarray, av: np.ndarray) -> None:
    """Overwrites, in av (one item per response token of every row), the
    tokens of the rows that carry token advantages with them."""
    if tok.null_count == len(tok):
        return
    ta, to = tok.values.to_numpy(zero_copy_only=False), tok.offsets.to_numpy(zero_copy_only=False)
    valid = ~np.asarray(tok.is_null().to_numpy(zero_copy_only=False))
    if not np.array_equal(np.diff(to)[valid], lengths[valid]):
        raise ValueError("token_advantages' lengths differ from response_ids'")
    dst = np.repeat(valid, lengths)
    src = ta[to[0] : to[-1]]
    if not np.all(np.diff(to)[~valid] == 0):  # null rows holding items: skip them
        src = src[np.repeat(valid, np.diff(to))]
    av[dst] = src


def _buffer(out: Optional["Padded"], name: str, rows: int, width: int, dtype, fill) -> np.ndarray:
    """A [rows, width] array filled with fill: out's array of that name when
    it has the shape and type (no new memory to fault in), else a new one."""
    prev = None if out is None else out._buffers.get(name)
    if prev is not None and prev.dtype == dtype and prev.shape[1] == width and prev.shape[0] >= rows:
        a = prev[:rows]
        a.fill(fill)
        return a
    return np.full((rows, width), fill, dtype=dtype)


def to_padded(
    record: pa.RecordBatch,
    pad_token_id: int,
    max_prompt_length: int,
    max_response_length: int,
    pad_rows_to_multiple: int = 1,
    mask_pad_token_ids: bool = False,
    warn: bool = True,
    out: Optional[Padded] = None,
    truncated_reward: str = "none",
) -> Padded:
    """Pads the rows of record (merged trajectory rows or step rows) in
    verl's layout; see the module's documentation.

    out, a Padded returned by an earlier call the caller is done with, lends
    its arrays: they are overwritten and returned again (a trainer that copies
    each batch to its device saves allocating and faulting in the memory of
    every batch)."""
    if max_prompt_length < 1 or max_response_length < 1:
        raise ValueError("max_prompt_length and max_response_length must be >= 1")
    if pad_rows_to_multiple < 1:
        raise ValueError("pad_rows_to_multiple must be >= 1")
    if truncated_reward not in ("none", "last_kept"):
        raise ValueError(f"truncated_reward {truncated_reward!r}: want 'none' (rLLM) or 'last_kept' (verl)")
    merged = _has(record, "response_mask")
    n = record.num_rows
    total_rows = -(-n // pad_rows_to_multiple) * pad_rows_to_multiple if n else 0
    n_pad = total_rows - n
    P, R = int(max_prompt_length), int(max_response_length)

    pv, po = _list(record, "prompt_ids")
    rv, ro = _list(record, "response_ids")
    plen, rlen = np.diff(po), np.diff(ro)
    pkeep, rkeep = np.minimum(plen, P), np.minimum(rlen, R)
    # Where the kept tokens go: row i's prompt ends at column P, its response
    # starts at column 0. Boolean masks fill row by row, in the values' order.
    pdst = np.arange(P) >= (P - pkeep)[:, None]
    rdst = np.arange(R) < rkeep[:, None]

    # prompts and responses are views of input_ids: no copy.
    input_ids = _buffer(out, "input_ids", total_rows, P + R, np.int64, pad_token_id)
    prompts, responses = input_ids[:, :P], input_ids[:, P:]
    r_sel = _selection(rlen, rkeep, from_end=False)
    p_src = _kept(pv, po, _selection(plen, pkeep, from_end=True))
    r_src = _kept(rv, ro, r_sel)
    prompts[:n][pdst] = p_src.astype(np.int64)
    responses[:n][rdst] = r_src.astype(np.int64)

    def kept_response(name: str, values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        if not np.array_equal(np.diff(offsets), rlen):
            raise ValueError(f"{name}'s lengths differ from response_ids'")
        return _kept(values, offsets, r_sel)

    def response_tensor(name: str, kept: np.ndarray, dtype) -> np.ndarray:
        a = _buffer(out, name, total_rows, R, dtype, 0)
        a[:n][rdst] = kept.astype(dtype, copy=False)  # one type: a plain copy
        return a

    if merged:
        mv, mo = _list(record, "response_mask")
        mask_kept = kept_response("response_mask", mv, mo)
        response_mask = response_tensor("response_mask", mask_kept, np.int64)
        lv, lo = _list(record, "rollout_log_probs")
        av, ao = _list(record, "advantages")
        adv_kept = np.multiply(kept_response("advantages", av, ao), mask_kept, dtype=np.float32)
        action_total = int(np.count_nonzero(mv[mo[0] : mo[-1]]))
        action_kept = int(np.count_nonzero(mask_kept))
    else:
        response_mask = _buffer(out, "response_mask", total_rows, R, np.int64, 0)
        response_mask[:n][rdst] = 1
        lv, lo = _list(record, "response_logprobs")
        av = np.repeat(_column(record, "advantage").to_numpy(zero_copy_only=False).astype(np.float32), rlen)
        if _has(record, "token_advantages"):
            _token_advantages(_column(record, "token_advantages"), rlen, av)
        adv_kept = kept_response("advantages", av, np.concatenate([[0], np.cumsum(rlen)]))
        action_total, action_kept = int(rlen.sum()), int(rkeep.sum())
    rollout_log_probs = response_tensor("rollout_log_probs", kept_response("rollout_log_probs", lv, lo), np.float32)
    # The version of each response token: merged rows carry it (-1 on
    # observations); step rows have token_versions, else their policy_version.
    if merged and _has(record, "response_versions"):
        vv, vo = _list(record, "response_versions")
        vers_kept = kept_response("response_versions", vv, vo)
    else:
        step_v = np.full(n, -1, dtype=np.int64)  # unknown: a record without versions
        if _has(record, "policy_version"):
            step_v = _column(record, "policy_version").to_numpy(zero_copy_only=False).astype(np.int64)
        vv = np.repeat(step_v, rlen)
        if merged:  # rows of an older server: the row's version on its actions
            vv = np.where(mv[mo[0] : mo[-1]] == 1, vv, -1)
        elif _has(record, "token_versions"):
            tv = _column(record, "token_versions")
            has = ~np.asarray(tv.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            starts = np.concatenate([[0], np.cumsum(rlen)])
            for i in np.nonzero(has)[0]:  # the rare rows whose tokens span versions
                v = tv[int(i)].as_py()
                if len(v) != rlen[i]:
                    raise ValueError("token_versions' lengths differ from response_ids'")
                vv[starts[i] : starts[i + 1]] = v
        vers_kept = kept_response("response_versions", vv, np.concatenate([[0], np.cumsum(rlen)]))
    response_versions = _buffer(out, "response_versions", total_rows, R, np.int64, -1)
    response_versions[:n][rdst] = vers_kept
    advantages = response_tensor("advantages", adv_kept, np.float32)  # masked: 0 off the actions
    old_log_probs = None
    if _has(record, "old_log_probs"):
        ov, oo = _list(record, "old_log_probs")
        old_log_probs = response_tensor("old_log_probs", kept_response("old_log_probs", ov, oo), np.float32)

    kept_tokens = int(pkeep.sum() + rkeep.sum())
    if mask_pad_token_ids:
        attention = np.not_equal(input_ids, pad_token_id)
        pad_id_tokens = kept_tokens - int(np.count_nonzero(attention))
    else:
        attention = np.zeros(input_ids.shape, dtype=bool)
        attention[:n, :P][pdst] = True
        attention[:n, P:][rdst] = True
        pad_id_tokens = int(np.count_nonzero(p_src == pad_token_id)) + int(np.count_nonzero(r_src == pad_token_id))
    attention_mask = _buffer(out, "attention_mask", total_rows, P + R, np.int64, 0)
    attention_mask[...] = attention
    position_ids = _buffer(out, "position_ids", total_rows, P + R, np.int64, 0)
    np.cumsum(attention_mask, axis=1, out=position_ids)
    position_ids -= 1
    position_ids *= attention_mask

    # Rewards at the last response token, when the response fits (as rLLM),
    # or at the last kept one (truncated_reward="last_kept", as verl).
    fits = (rlen > 0) & ((rlen <= R) | (truncated_reward == "last_kept"))
    at = (np.nonzero(fits)[0], rkeep[fits] - 1)
    traj_rewards = _buffer(out, "traj_rewards", total_rows, R, np.float32, 0)
    reward = _column(record, "reward").to_numpy(zero_copy_only=False).astype(np.float32)
    traj_rewards[at] = reward[fits]
    step_rewards = _buffer(out, "step_rewards", total_rows, R, np.float32, 0)
    if merged or not _has(record, "step_reward"):
        step_rewards[at] = reward[fits] if merged else 0
    else:
        step_reward = _column(record, "step_reward").fill_null(0).to_numpy(zero_copy_only=False).astype(np.float32)
        step_rewards[at] = step_reward[fits]

    # Padding rows copy real rows cyclically (verl's pad_dataproto_to_divisor),
    # rewards included (rLLM's trainer zeroes only the response mask and the
    # advantages): response_mask and advantages stay 0, nothing to train on.
    copied = np.arange(n_pad) % n if n else np.zeros(0, dtype=np.int64)
    if n_pad:
        for a in (input_ids, attention_mask, position_ids, rollout_log_probs, old_log_probs, traj_rewards, step_rewards):
            if a is not None:
                a[n:] = a[copied]
    is_pad = np.zeros(total_rows, dtype=bool)
    is_pad[n:] = True
    prompt_truncated = np.zeros(total_rows, dtype=bool)
    prompt_truncated[:n] = plen > P
    prompt_truncated[n:] = prompt_truncated[copied]
    response_truncated = np.zeros(total_rows, dtype=bool)
    response_truncated[:n] = rlen > R
    response_truncated[n:] = response_truncated[copied]
    truncation = {
        "rows": n,
        "pad_rows": n_pad,
        "prompts_truncated": int(np.count_nonzero(plen > P)),
        "prompt_tokens_dropped": int((plen - pkeep).sum()),
        "responses_truncated": int(np.count_nonzero(rlen > R)),
        "response_tokens_dropped": int((rlen - rkeep).sum()),
        "action_tokens_dropped": action_total - action_kept,
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

    buffers = {
        "input_ids": input_ids,
        "response_mask": response_mask,
        "rollout_log_probs": rollout_log_probs,
        "advantages": advantages,
        "old_log_probs": old_log_probs,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "traj_rewards": traj_rewards,
        "step_rewards": step_rewards,
        "response_versions": response_versions,
    }
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
        ids[out_name] = _pad_ids(values, copied)
    if n_pad and "is_last_step" in ids:
        ids["is_last_step"][n:] = False  # as rLLM marks its padding rows
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
        response_versions=response_versions,
        step_rewards=step_rewards,
        is_pad=is_pad,
        is_valid=~is_pad,
        prompt_truncated=prompt_truncated,
        response_truncated=response_truncated,
        ids=ids,
        truncation=truncation,
        old_log_probs=old_log_probs,
        _buffers={name: a if a.base is None else a.base for name, a in buffers.items() if a is not None},
    )
