"""rllm-pipe batches as verl 0.9 takes them (the ``verl`` extra: torch and
verl are needed here and nowhere else in the package).

With ``location`` the address of ``rllm-pipe serve --layout trajectories
--follow=false`` (see ``rllm_pipe``):

    >>> from rllm_pipe import PaddedBatches
    >>> from rllm_pipe.verl import dataproto
    >>> data = PaddedBatches(location, "verl-actor", pad_token_id=0, max_prompt_length=2048,
    ...                      max_response_length=8192, pad_rows_to_multiple=8)
    >>> for step in data:
    ...     with step:                                      # acknowledged after the update
    ...         dp = dataproto(step.padded, temperature=1.0)  # verl.protocol.DataProto
    ...         # verl's actor update on dp
    >>> len(dp) % 8, "uid" in dp.non_tensor_batch, dp.meta_info["temperature"]
    (0, True, 1.0)

Two forms, from one padded batch (``Batch.to_padded`` / ``PaddedBatches``):

- ``dataproto(padded)``: verl's legacy ``DataProto`` (the padded layout of
  ``RayPPOTrainer`` and of ``verl.workers.utils.padding.left_right_2_no_padding``,
  which the v1 actor update uses too), with every key its PPO/GRPO path reads:
  ``input_ids``, ``attention_mask``, ``position_ids``, ``prompts``,
  ``responses``, ``response_mask``, ``rollout_log_probs``, ``old_log_probs``
  (the rollout's, for bypass mode, unless asked to leave them out),
  ``rm_scores`` = ``token_level_scores`` = ``token_level_rewards`` (the reward
  on the last response token), ``advantages`` = ``returns`` (rllm-pipe's);
  ``uid`` and the rest of the per-row ids in ``non_tensor_batch``;
  ``meta_info`` ``temperature`` and ``global_token_num``.
- ``v1_samples(padded)``: verl's v1 per-sample form (what its agent loop puts
  into TransferQueue: unpadded 1-D ``prompts``, ``responses``,
  ``response_mask``, ``input_ids``, ``position_ids``, ``rollout_log_probs``,
  ``rm_scores`` and the ``uid``), with the TransferQueue keys
  ``{uid}_{trajectory}_{segment}`` that v1's
  ``compute_advantage_for_multi_trajectories`` reads; ``v1_tensordict`` stacks
  them as verl's ``list_of_dict_to_tensordict`` does.

Groups and multi-row trajectories: ``uid`` is the group (a hex digest of
rllm-pipe's group id, version and role: verl splits keys at ``_``, so ids
from records never go in raw). A trajectory cut into several rows (context
resets, prompt forks) has one key per row, ``{uid}_{k}_{segment}`` with k its
place in the group; verl's per-row GRPO (``compute_grpo_outcome_advantage``
with ``index=uid``) would count each row as a sample, v1's multi-trajectory
function and rllm-pipe's own advantages count the trajectory once.

Padding rows (``pad_rows_to_multiple``) copy real rows; here each gets a
``uid`` of its own, no reward and no advantage, so a GRPO recomputed over the
batch is the same as over the real rows alone, and they add nothing to the
loss. ``drop_padding=True`` leaves them out instead.

verl derives response lengths from ``attention_mask``: ``to_padded``'s default
(attention from the rows' lengths) keeps them exact; a batch padded with
``mask_pad_token_ids=True`` is refused when a real token equals the pad id.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .padded import Padded

if TYPE_CHECKING:  # pragma: no cover - the verl extra
    from tensordict import TensorDict
    from verl.protocol import DataProto

__all__ = ["dataproto", "batch_keys", "group_uids", "v1_samples", "v1_tensordict", "use_cpu"]


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - the extra is missing
        raise ImportError("rllm_pipe.verl needs torch and verl: pip install 'rllm-pipe[verl]'") from e
    return torch


def group_uids(padded: Padded) -> np.ndarray:
    """Each row's group as verl's ``uid``: a 16-hex-digit digest of the group
    id, version and role (never an ``_``, which verl's keys split at); a
    padding row gets ``pad-<row>``, a group of its own."""
    ids = padded.ids
    gid, ver = ids["group_ids"], ids.get("group_versions")
    roles = ids.get("roles")
    out = np.empty(padded.num_rows, dtype=object)
    cache: Dict[tuple, str] = {}
    for i in range(padded.num_rows):
        if padded.is_pad[i]:
            out[i] = f"pad-{i}"
            continue
        k = (gid[i], None if ver is None else int(ver[i]), None if roles is None else roles[i])
        u = cache.get(k)
        if u is None:
            u = hashlib.sha256(repr(k).encode()).hexdigest()[:16]
            cache[k] = u
        out[i] = u
    return out


def _segments(padded: Padded) -> tuple:
    """Per row: its trajectory's place in its group (0..), and its place in
    its trajectory (0.., by first step)."""
    ids = padded.ids
    n = padded.num_rows
    uids = group_uids(padded)
    traj = ids["trajectory_ids"]
    first = ids["first_step_index"].astype(np.int64)
    seg = np.zeros(n, dtype=np.int64)
    k = np.zeros(n, dtype=np.int64)
    places: Dict[str, Dict[Any, int]] = {}
    rows: Dict[tuple, List[int]] = {}
    for i in range(n):
        if padded.is_pad[i]:
            continue
        p = places.setdefault(uids[i], {})
        k[i] = p.setdefault(traj[i], len(p))
        rows.setdefault((uids[i], traj[i]), []).append(i)
    for rs in rows.values():
        for s, i in enumerate(sorted(rs, key=lambda i: first[i])):
            seg[i] = s
    return uids, k, seg


def batch_keys(padded: Padded) -> List[str]:
    """The TransferQueue keys of the rows, ``{uid}_{trajectory}_{segment}``,
    as verl v1's agent loop writes them and ``compute_advantage_for_multi_trajectories``
    reads them (a padding row: ``pad-<row>_0_0``)."""
    uids, k, seg = _segments(padded)
    return [f"{u}_{t}_{s}" for u, t, s in zip(uids, k, seg)]


def _check_mask(padded: Padded) -> None:
    """The response's attention must be its first tokens with no hole, the
    prompt's its last: verl reads the lengths off it."""
    P = padded.prompts.shape[1]
    am = padded.attention_mask
    plen, rlen = am[:, :P].sum(axis=1), am[:, P:].sum(axis=1)
    want_r = np.arange(am.shape[1] - P)[None, :] < rlen[:, None]
    want_p = np.arange(P)[None, :] >= (P - plen)[:, None]
    ok = (am[:, P:] == want_r).all(axis=1) & (am[:, :P] == want_p).all(axis=1)
    if not ok[~padded.is_pad].all():
        raise ValueError("attention_mask has holes (to_padded(mask_pad_token_ids=True) with real tokens equal to the pad id): "
                         "verl reads response lengths off it and would shift log-probs; pad with the default")


def dataproto(
    padded: Padded,
    *,
    temperature: float = 1.0,
    old_log_probs: str = "rollout",
    drop_padding: bool = False,
    meta_info: Optional[Dict[str, Any]] = None,
) -> DataProto:
    """The batch as verl's ``DataProto`` (see the module's documentation).

    temperature: the sampling temperature the rollouts were generated with
    (verl divides logits by it before taking log-probs; ``meta_info``).
    old_log_probs: ``"rollout"`` sets ``old_log_probs`` to the rollout's
    log-probs (verl's bypass mode, ``algorithm.rollout_correction.bypass_mode``:
    no recomputation); ``"recompute"`` leaves them out for verl's actor to
    compute. drop_padding: leave the padding rows out (the batch is then no
    longer a multiple of ``pad_rows_to_multiple``)."""
    torch = _torch()
    from verl.protocol import DataProto

    if old_log_probs not in ("rollout", "recompute"):
        raise ValueError(f"old_log_probs {old_log_probs!r}: want 'rollout' or 'recompute'")
    _check_mask(padded)
    keep = ~padded.is_pad if drop_padding else np.ones(padded.num_rows, dtype=bool)
    real = ~padded.is_pad[keep]
    arrays = {k: v[keep] for k, v in padded.arrays().items()}
    rewards = arrays["traj_rewards"] * real[:, None]  # padding rows: no reward
    tensors = {
        "input_ids": arrays["input_ids"],
        "attention_mask": arrays["attention_mask"],
        "position_ids": arrays["position_ids"],
        "prompts": arrays["prompts"],
        "responses": arrays["responses"],
        "response_mask": arrays["response_mask"],
        "rollout_log_probs": arrays["rollout_log_probs"],
        "rm_scores": rewards,
        "token_level_scores": rewards,
        "token_level_rewards": rewards,
        "advantages": arrays["advantages"],
        "returns": arrays["advantages"],
        # not read by verl: each response token's policy version (-1 off the
        # actions), for off-policy corrections that need it
        "response_versions": arrays["response_versions"],
    }
    if old_log_probs == "rollout":
        tensors["old_log_probs"] = arrays["old_log_probs"] if "old_log_probs" in arrays else arrays["rollout_log_probs"]
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}
    uids, k, seg = _segments(padded)
    non_tensors = {name: np.asarray(v)[keep] for name, v in padded.ids.items()}
    non_tensors["uid"] = uids[keep]
    non_tensors["trajectory_index"] = k[keep]
    non_tensors["segment_index"] = seg[keep]
    non_tensors["batch_key"] = np.array([f"{u}_{a}_{b}" for u, a, b in zip(uids, k, seg)], dtype=object)[keep]
    non_tensors["is_pad"] = padded.is_pad[keep]
    meta = {"temperature": float(temperature), "global_token_num": t["attention_mask"].sum(dim=-1).tolist()}
    meta.update(meta_info or {})
    return DataProto.from_dict(tensors=t, non_tensors=non_tensors, meta_info=meta)


def v1_samples(padded: Padded) -> Tuple[List[Dict[str, Any]], List[str]]:
    """The real rows as verl v1's per-sample dicts (unpadded 1-D tensors, as
    its agent loop's outputs) and their TransferQueue keys. A row's prompt
    and response are the ones ``to_padded`` kept (cut to its lengths)."""
    torch = _torch()
    P = padded.prompts.shape[1]
    plen = padded.attention_mask[:, :P].sum(axis=1)
    rlen = padded.attention_mask[:, P:].sum(axis=1)
    uids, k, seg = _segments(padded)
    samples, keys = [], []
    for i in np.nonzero(~padded.is_pad)[0]:
        p, r = int(plen[i]), int(rlen[i])
        prompt = padded.prompts[i, P - p :]
        response = padded.responses[i, :r]
        mask = padded.response_mask[i, :r]
        scores = padded.traj_rewards[i, :r]
        sample = {
            "prompts": torch.from_numpy(prompt.copy()),
            "responses": torch.from_numpy(response.copy()),
            "response_mask": torch.from_numpy(mask.copy()),
            "loss_mask": torch.from_numpy(mask.copy()),
            "input_ids": torch.from_numpy(np.concatenate([prompt, response])),
            "position_ids": torch.arange(p + r, dtype=torch.int64),
            "rollout_log_probs": torch.from_numpy(padded.rollout_log_probs[i, :r].copy()),
            "rm_scores": torch.from_numpy(scores.copy()),
            "advantages": torch.from_numpy(padded.advantages[i, :r].copy()),
            "uid": uids[i],
        }
        samples.append(sample)
        keys.append(f"{uids[i]}_{k[i]}_{seg[i]}")
    return samples, keys


def v1_tensordict(padded: Padded) -> Tuple[TensorDict, List[str]]:
    """``v1_samples`` stacked as verl does (``list_of_dict_to_tensordict``:
    nested jagged tensors for ragged fields), and the keys."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    samples, keys = v1_samples(padded)
    return list_of_dict_to_tensordict(samples), keys



def use_cpu() -> None:
    """Registers a CPU platform with verl (0.9 ships CUDA, NPU and ROCm ones
    only), so that its FSDP engine (``strategy="fsdp2"``) runs in one gloo
    process: tests and examples on a machine without a GPU. Call it before
    verl's engine modules are imported (they read the platform when
    loaded)."""
    import contextlib

    import psutil

    torch = _torch()
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import set_platform

    class _Device:
        """torch.cpu where it has the call, a no-op returning 0 otherwise."""

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return getattr(torch.cpu, name, lambda *a, **k: 0)

        def mem_get_info(self, *a, **k):
            vm = psutil.virtual_memory()
            return vm.available, vm.total

        def is_available(self):
            return True

    class CPUPlatform(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = _Device()

        def is_available(self):
            return True

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, i):
            pass

        def synchronize(self, i=None):
            pass

        def manual_seed(self, s):
            torch.manual_seed(s)

        def manual_seed_all(self, s):
            torch.manual_seed(s)

        def set_allocator_settings(self, s):
            pass

        def empty_cache(self):
            pass

        def get_device_capability(self, i=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CPU_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg):
            yield

        def profiler_start(self):
            pass

        def profiler_stop(self):
            pass

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None

    set_platform(CPUPlatform())
