"""rllm-pipe batches into the real verl 0.9 (scripts/verl-test.sh builds the
environment once, cached: torch and verl are optional extras and these tests
skip without them).

Generated multi-turn traces with context resets (so trajectories span
several rows) and the pad id inside the rows go through ingest (GRPO with
verl's conventions) and serve; the batches meet verl's own code: its GRPO
functions, DataProto, its v1 per-sample stacking, and one PPO actor update
of a tiny random model on CPU through verl's FSDP engine and ppo_loss."""

import os
from functools import partial

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from conftest import Server, run  # noqa: E402
from rllm_pipe import Client  # noqa: E402
from rllm_pipe.verl import batch_keys, dataproto, group_uids, v1_tensordict  # noqa: E402

PAD = 0  # emitted by the generator: a real token too
VOCAB = 300


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl")
    src = root / "traces.jsonl"
    run("gen", "--groups", "16", "--group-size", "4", "--turns", "1..6", "--resets", "0.3", "--observation-len", "12",
        "--prompt-len", "24", "--response-len", "16", "--vocab", str(VOCAB), "--seed", "11", "--to", str(src))
    out = root / "out"
    run("ingest", "--from", str(src), "--to", str(out), "--group-size", "4", "--compat", "verl", "--quiet")
    started = []

    def start(group, *flags):
        s = Server(out, "--follow=false", "--poll", "50ms", "--consumer-group", group, "--layout", "trajectories", *flags)
        started.append(s)
        return s

    start.root = out
    yield start
    for s in started:
        s.stop()


def padded_batches(srv, P=256, R=512, **kw):
    out = []
    with Client(srv.location, consumer="t") as c:
        for b in c.batches():
            out.append(b.to_padded(PAD, P, R, **kw))
            b.ack()
    return out


def test_grpo_equals_verls_on_single_and_multi_row_trajectories(served):
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    multi = single = 0
    for p in padded_batches(served("grpo", "--batch-groups", "4"), pad_rows_to_multiple=8):
        dp = dataproto(p)
        real = ~p.is_pad
        ours = dp.batch["advantages"].clone()
        # v1's multi-trajectory GRPO with our keys: the trajectory counted once.
        got = compute_advantage_for_multi_trajectories(dp, batch_keys(p), core_algos.AdvantageEstimator.GRPO)
        np.testing.assert_allclose(got.batch["advantages"].numpy(), ours.numpy(), rtol=0, atol=2e-6)
        rows = p.ids["rows_in_trajectory"]
        multi += int((rows[real] > 1).sum())
        # verl's per-row GRPO on the groups whose trajectories are one row each.
        one = np.array([all(rows[(group_uids(p) == u)] == 1) for u in group_uids(p)]) & real
        if one.any():
            idx = np.nonzero(one)[0]
            adv, _ = core_algos.compute_grpo_outcome_advantage(dp.batch["token_level_rewards"][idx], dp.batch["response_mask"][idx],
                                                                dp.non_tensor_batch["uid"][idx])
            np.testing.assert_allclose(adv.numpy(), ours[idx].numpy(), rtol=0, atol=2e-6)
            single += len(idx)
        # Padding rows are groups of their own with no reward: a GRPO over the
        # padded batch equals one over the real rows.
        assert not dp.batch["token_level_rewards"][~torch.from_numpy(real)].any()
        assert (dp.batch["advantages"][~torch.from_numpy(real)] == 0).all()
    assert multi > 0 and single > 0, (multi, single)


def test_dataproto_round_trips_and_mini_batches(served, tmp_path):
    from verl import DataProto

    p = padded_batches(served("round-trip", "--batch-groups", "4"), pad_rows_to_multiple=4)[0]
    dp = dataproto(p, temperature=0.7)
    assert dp.meta_info["temperature"] == 0.7 and dp.meta_info["global_token_num"] == p.attention_mask.sum(axis=1).tolist()
    for k in ("input_ids", "attention_mask", "position_ids", "prompts", "responses", "response_mask", "rollout_log_probs",
              "old_log_probs", "token_level_scores", "token_level_rewards", "rm_scores", "advantages", "returns"):
        assert k in dp.batch.keys(), k
    torch.testing.assert_close(dp.batch["old_log_probs"], dp.batch["rollout_log_probs"])  # bypass mode: the rollout's
    assert "old_log_probs" not in dataproto(p, old_log_probs="recompute").batch.keys()
    dp.save_to_disk(tmp_path / "dp.pt")
    back = DataProto.load_from_disk(tmp_path / "dp.pt")
    for k in dp.batch.keys():
        torch.testing.assert_close(back.batch[k], dp.batch[k])
    assert list(back.non_tensor_batch["uid"]) == list(dp.non_tensor_batch["uid"])
    td = dp.to_tensordict()
    again = DataProto.from_tensordict(td)
    torch.testing.assert_close(again.batch["input_ids"], dp.batch["input_ids"])
    parts = dp.split(2)
    assert sum(len(x) for x in parts) == len(dp) and len(dp) % 4 == 0


def test_a_batch_padded_with_holes_is_refused(served):
    p = padded_batches(served("holes"), mask_pad_token_ids=True)
    with pytest.raises(ValueError, match="holes"):
        for x in p:
            dataproto(x)


def test_v1_samples_are_accepted(served):
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    for p in padded_batches(served("v1", "--batch-groups", "4")):
        td, keys = v1_tensordict(p)
        real = ~p.is_pad
        assert len(keys) == int(real.sum()) == td.batch_size[0]
        # What v1's trainer does with them before its advantage step.
        sel = td.select("response_mask", "rm_scores", "rollout_log_probs")
        data = DataProto(batch=sel.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["token_level_rewards"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = np.array([k.split("_")[0] for k in keys], dtype=object)
        got = compute_advantage_for_multi_trajectories(data, keys, core_algos.AdvantageEstimator.GRPO)
        R = got.batch["advantages"].shape[1]
        np.testing.assert_allclose(got.batch["advantages"].numpy(), p.advantages[real][:, :R], rtol=0, atol=2e-6)
        for i, k in enumerate(keys):  # the unpadded tensors are the row's tokens
            n = int(p.attention_mask[np.nonzero(real)[0][i], p.prompts.shape[1]:].sum())
            assert td["responses"][i].shape[0] == n and td["input_ids"][i].shape[0] == td["position_ids"][i].shape[0]


@pytest.fixture(scope="module")
def cpu_engine():
    """verl's FSDP engine on CPU (fsdp2, one gloo process) over a tiny
    randomly initialised Qwen3, built as examples/verl_trainer.py builds it."""
    import argparse
    import importlib.util

    import torch.distributed as dist

    from conftest import REPO
    from rllm_pipe.verl import use_cpu

    use_cpu()  # before verl's engine modules read the platform
    spec = importlib.util.spec_from_file_location("verl_trainer", REPO / "train" / "python" / "examples" / "verl_trainer.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group(backend="gloo", rank=0, world_size=1)
    path = ex.tiny_model(512)
    args = argparse.Namespace(cpu=True, micro_batch=4, max_prompt=128, max_response=256, lr=1e-2)
    yield ex.engine_for(path, args), path
    dist.destroy_process_group()


def _model_log_probs(model, p, temperature=1.0):
    """The log-probs of every row's response tokens under model, computed on
    the unpadded sequence (independently of verl's padding handling)."""
    P = p.prompts.shape[1]
    out = np.zeros(p.responses.shape, dtype=np.float32)
    with torch.no_grad():
        for i in range(p.num_rows):
            pl, rl = int(p.attention_mask[i, :P].sum()), int(p.attention_mask[i, P:].sum())
            seq = torch.from_numpy(np.concatenate([p.prompts[i, P - pl:], p.responses[i, :rl]]))[None]
            logits = model(seq).logits[0].float() / temperature
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, seq[0, 1:, None])[:, 0]
            out[i, :rl] = lp[pl - 1:].numpy()
    return out


def test_actor_update_on_cpu_realigns_log_probs_and_moves_the_loss(served, cpu_engine):
    from transformers import AutoModelForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric.utils import reduce_metrics
    from verl.workers.config import ActorConfig
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    engine, path = cpu_engine
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    batches = padded_batches(served("actor", "--batch-groups", "2"), P=128, R=256, pad_rows_to_multiple=4)
    # A batch with something to learn (groups whose rewards all tie have
    # no advantage, no gradient).
    p = next(b for b in batches if np.abs(b.advantages).max() > 0)
    # old_log_probs = the current model's own: the ratio is 1 on every action
    # token iff verl's log-probs line up with ours (a hole in the mask
    # shifts them: ppo_kl far from 0).
    p.old_log_probs = _model_log_probs(model, p)
    actor = ActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=4)
    losses = []
    for step in range(3):
        dp = dataproto(p)
        td = left_right_2_no_padding(dp.to_tensordict())
        tu.assign_non_tensor(td, global_batch_size=len(dp), use_remove_padding=False, use_dynamic_bsz=False,
                             micro_batch_size_per_gpu=4, max_token_len_per_gpu=4096, use_fused_kernels=False)
        with engine.train_mode():
            out = engine.train_batch(td, loss_function=partial(ppo_loss, config=actor))
        m = reduce_metrics(out["metrics"])
        if step == 0:
            assert abs(m["actor/ppo_kl"]) < 1e-5, f"verl's log-probs differ from the model's on the first step: {m}"
        losses.append(m["actor/pg_loss"])
    assert len(set(np.round(losses, 6))) > 1, f"the loss did not move: {losses}"


def test_example_trains_acknowledges_and_publishes(served):
    """examples/verl_trainer.py on CPU: three steps of 2 groups through
    verl's actor update; each acknowledged with the version it made, which
    is published for the gateway."""
    import json
    import socket
    import subprocess
    import sys

    from conftest import BIN, REPO, example_env

    srv = served("example")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = example_env(MASTER_PORT=str(port))
    out = subprocess.run([sys.executable, str(REPO / "train" / "python" / "examples" / "verl_trainer.py"), "--serve", srv.location,
                          "--tiny-model", "--cpu", "--steps", "3", "--groups-per-step", "2", "--lr", "1e-2"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [s["version"] for s in steps] == [1, 2, 3] and all(s["groups"] == 2 for s in steps), steps
    # A step whose groups' rewards all tie has no gradient; the others do.
    assert any(s["grad_norm"] > 0 for s in steps) and len({round(s["pg_loss"], 6) for s in steps}) > 1, steps
    shown = subprocess.run([BIN, "publish-version", "--show", "--from", str(served.root), "--consumer-group", "example"],
                           capture_output=True, text=True, check=True).stdout
    assert json.loads(shown)["policy_version"] == 3, shown


def test_docstring_examples(served, tmp_path, monkeypatch):
    """rllm_pipe.verl's docstring examples, which test_docs.py runs only
    where torch and verl import (here), on this module's run."""
    from test_docs import MODULES, run_doctests

    monkeypatch.chdir(tmp_path)
    docstrings, _, failures = run_doctests("rllm_pipe.verl", {"location": served("doctest").location})
    assert not failures, failures
    assert docstrings >= MODULES["rllm_pipe.verl"]
