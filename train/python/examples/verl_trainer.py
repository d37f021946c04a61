"""A verl 0.9 actor trained from rllm-pipe: the fit loop of verl's trainer
with its rollout side replaced by ``rllm-pipe serve``.

Each step: the batch of exactly ``--groups-per-step`` groups (``PaddedBatches``,
``batch_groups``), as verl's ``DataProto`` (``rllm_pipe.verl.dataproto``:
GRPO advantages from ingest with ``--compat verl``, the rollout's log-probs as
``old_log_probs``: verl's bypass mode), through verl's own actor update
(``left_right_2_no_padding``, its FSDP engine's ``train_batch`` with
``ppo_loss``, as v1's ``TrainingWorker`` runs it); then the acknowledgement
with the version the update made, and the version published for the
capture gateway (``PaddedBatches.publish_version``).

    pip install './train/python[verl]'
    python train/python/examples/verl_trainer.py --serve grpc://127.0.0.1:8815 --tiny-model --cpu --steps 3

``--tiny-model`` trains a randomly initialised two-layer Qwen3 (no download);
``--model PATH`` a Hugging Face checkpoint. ``--cpu`` registers a CPU
platform with verl (``rllm_pipe.verl.use_cpu``) and runs one gloo process;
without it verl picks the GPU as usual. What this does not do: load the new
weights into an inference engine (verl's checkpoint manager pushes them to
its vLLM/SGLang replicas; with rllm-pipe's gateway in front of your own
engine, load them there, then publish), nor run verl's v1 ``PPOTrainer``
itself, whose setup starts those replicas (GPU).

Prints one JSON line per step: version, groups, pg_loss, ppo_kl, grad_norm.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from functools import partial


def tiny_model(vocab: int) -> str:
    """A randomly initialised Qwen3 saved to a temporary folder (verl's
    engine loads weights from a path)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = tempfile.mkdtemp(prefix="tiny-qwen3-")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


def engine_for(path: str, args):
    """verl's FSDP actor engine (fsdp2), as its TrainingWorker builds it."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"} if args.cpu else None
    engine_kw = dict(strategy="fsdp2", forward_only=False, fsdp_size=1, use_remove_padding=False, use_dynamic_bsz=False,
                     micro_batch_size_per_gpu=args.micro_batch, max_token_len_per_gpu=args.max_prompt + args.max_response,
                     use_torch_compile=False)
    if fp32:
        engine_kw["mixed_precision"] = fp32
    engine = FSDPEngineWithLMHead(
        model_config=HFModelConfig(path=path, load_tokenizer=False, use_remove_padding=False,
                                   override_config={"attn_implementation": "eager"} if args.cpu else {}),
        engine_config=FSDPEngineConfig(**engine_kw),
        optimizer_config=FSDPOptimizerConfig(lr=args.lr, lr_scheduler_type="constant"),
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", required=True, help="grpc://host:port of rllm-pipe serve (--layout trajectories)")
    ap.add_argument("--consumer", default="verl-actor")
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: when serve has no more)")
    ap.add_argument("--model", help="a Hugging Face checkpoint folder")
    ap.add_argument("--tiny-model", action="store_true", help="a random two-layer Qwen3 instead (no download)")
    ap.add_argument("--vocab", type=int, default=512, help="--tiny-model's vocabulary (above every token id of the data)")
    ap.add_argument("--cpu", action="store_true", help="run verl's engine on CPU (one gloo process)")
    ap.add_argument("--pad-token-id", type=int, default=0)
    ap.add_argument("--max-prompt", type=int, default=256)
    ap.add_argument("--max-response", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=4, help="rows per micro-batch; batches are padded to a multiple of it")
    ap.add_argument("--temperature", type=float, default=1.0, help="the rollouts' sampling temperature")
    ap.add_argument("--lr", type=float, default=1e-5)
    args = ap.parse_args()
    if not args.model and not args.tiny_model:
        ap.error("--model PATH or --tiny-model")

    import torch.distributed as dist

    from rllm_pipe import PaddedBatches
    from rllm_pipe.verl import dataproto, use_cpu

    if args.cpu:
        use_cpu()  # before verl's engine modules are imported
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric.utils import reduce_metrics
    from verl.workers.config import ActorConfig
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29541")
        dist.init_process_group(backend="gloo" if args.cpu else "nccl", rank=0, world_size=1)
    engine = engine_for(args.model or tiny_model(args.vocab), args)
    loss = partial(ppo_loss, config=ActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=args.micro_batch))

    data = PaddedBatches(args.serve, args.consumer, pad_token_id=args.pad_token_id, max_prompt_length=args.max_prompt,
                         max_response_length=args.max_response, pad_rows_to_multiple=args.micro_batch,
                         batch_groups=args.groups_per_step, padding={"warn": False})
    n = 0
    for step in data:
        t0 = time.monotonic()
        with engine.train_mode():
            engine.optimizer_zero_grad()
            metrics = {}
            # A step split by serve's --max-tokens: gradients accumulate over
            # its parts (each part's loss a token mean over the part).
            for p in step.micro_batches:
                dp = dataproto(p, temperature=args.temperature)
                td = left_right_2_no_padding(dp.to_tensordict())
                tu.assign_non_tensor(td, global_batch_size=len(dp), use_remove_padding=False, use_dynamic_bsz=False,
                                     micro_batch_size_per_gpu=args.micro_batch,
                                     max_token_len_per_gpu=args.max_prompt + args.max_response, use_fused_kernels=False)
                out = engine.forward_backward_batch(td, loss, forward_only=False)
                for k, v in reduce_metrics(out["metrics"]).items():
                    metrics.setdefault(k, []).append(v)
            grad_norm = engine.optimizer_step()
        step.ack()  # the version the update made: policy_version + 1
        # Load the new weights into the inference engine here, then:
        data.publish_version(data.policy_version)
        mean = lambda k: float(sum(metrics[k]) / len(metrics[k])) if metrics.get(k) else None  # noqa: E731
        print(json.dumps({"version": data.policy_version, "groups": len(step.groups), "micro_batches": len(step.micro_batches),
                          "pg_loss": mean("actor/pg_loss"), "ppo_kl": mean("actor/ppo_kl"), "grad_norm": float(grad_norm),
                          "staleness_max": step.staleness["max"], "seconds": round(time.monotonic() - t0, 3)}), flush=True)
        n += 1
        if args.steps and n >= args.steps:
            break
    dist.destroy_process_group()
    return 0 if n else 1


if __name__ == "__main__":
    raise SystemExit(main())
