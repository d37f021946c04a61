"""Batch.to_padded against a real `rllm-pipe serve --layout trajectories` on
generated multi-turn data with context resets, ragged lengths, truncation and
distillation token advantages, compared with an independent implementation of
rLLM's rules (rllm/trainer/verl/transform.py) applied to the same trajectories
served as step rows."""

import warnings

import numpy as np
import pytest

from conftest import Server, run
from rllm_pipe import Client
from rllm_pipe.padded import TruncationWarning

PAD = 0  # a token id the generator also emits: attention follows rLLM's rule


@pytest.fixture(scope="module")
def multiturn(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiturn")
    src = root / "traces.jsonl"
    run("gen", "--groups", "24", "--group-size", "4", "--turns", "1..9", "--resets", "0.2", "--observation-len", "24",
        "--prompt-len", "48", "--response-len", "24", "--vocab", "300", "--teacher", "--token-versions", "--seed", "7", "--to", str(src))
    out = root / "out"
    run("ingest", "--from", str(src), "--to", str(out), "--group-size", "4", "--kl-coef", "0.5", "--kl-clip", "1",
        "--shard-size", "64KiB", "--quiet")
    return out


@pytest.fixture
def serve_mt(multiturn):
    started = []

    def start(*flags):
        s = Server(multiturn, "--follow=false", "--poll", "50ms", *flags)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def drain_records(location, consumer):
    out = []
    with Client(location, consumer=consumer) as c:
        for b in c.batches():
            out.append(b)
            b.ack()
    return out


# --- the reference: rLLM's rules, written independently, row by row ---------


def ref_merge(steps):
    """steps: dicts of one trajectory in step order -> merged rows (dicts)."""
    rows, seg, full = [], None, None
    for s in steps:
        p, a, lp = list(s["prompt_ids"]), list(s["response_ids"]), list(s["response_logprobs"])
        adv = list(s["token_advantages"]) if s["token_advantages"] is not None else [s["advantage"]] * len(a)
        tv = list(s["token_versions"]) if s["token_versions"] is not None else [s["policy_version"]] * len(a)
        if seg is not None and len(p) >= len(full) and p[: len(full)] == full:
            obs = p[len(full) :]
            seg["response"] += obs + a
            seg["tv"] += [-1] * len(obs) + tv
            seg["mask"] += [0] * len(obs) + [1] * len(a)
            seg["lp"] += [0.0] * len(obs) + lp
            seg["adv"] += [0.0] * len(obs) + adv
            seg["last"] = s["step_index"]
            seg["merged"] += 1
            seg["versions"] += [s["policy_version"]] + tv
            full += obs + a
        else:
            if seg is not None:
                rows.append(seg)
            seg = {"traj": s["trajectory_id"], "first": s["step_index"], "last": s["step_index"], "prompt": p,
                   "response": list(a), "tv": tv, "mask": [1] * len(a), "lp": lp, "adv": adv, "reward": s["reward"],
                   "merged": 1, "versions": [s["policy_version"]] + tv, "segment": len(rows)}
            full = p + a
        seg["is_last"] = s["step_index"] == s["num_steps"] - 1
        seg["token_advantages"] = seg.get("token_advantages", 0) + (s["token_advantages"] is not None)
    rows.append(seg)
    for r in rows:
        r["rows_in_trajectory"] = len(rows)
    return rows


def ref_pad(rows, pad, P, R):
    """verl's padding as rLLM does it, one row at a time."""
    n = len(rows)
    out = {k: np.zeros((n, w), dtype=np.float64) for k, w in
           [("prompts", P), ("responses", R), ("response_mask", R), ("rollout_log_probs", R), ("advantages", R), ("traj_rewards", R)]}
    out["prompts"][:] = pad
    out["responses"][:] = pad
    out["response_versions"] = np.full((n, R), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        p = r["prompt"][-P:]  # left pad, keep the end
        out["prompts"][i, P - len(p) :] = p
        resp = r["response"][:R]  # right pad, keep the start
        out["responses"][i, : len(resp)] = resp
        out["response_mask"][i, : len(resp)] = r["mask"][:R]
        out["response_versions"][i, : len(resp)] = r["tv"][:R]
        out["rollout_log_probs"][i, : len(resp)] = r["lp"][:R]
        out["advantages"][i, : len(resp)] = np.array(r["adv"][:R]) * np.array(r["mask"][:R])
        if 0 < len(r["response"]) <= R:
            out["traj_rewards"][i, len(r["response"]) - 1] = r["reward"]
    out["step_rewards"] = out["traj_rewards"]  # a merged row's step reward is its trajectory's (rLLM)
    out["input_ids"] = np.concatenate([out["prompts"], out["responses"]], axis=1)
    out["attention_mask"] = (out["input_ids"] != pad).astype(np.int64)
    out["position_ids"] = (np.cumsum(out["attention_mask"], axis=1) - 1) * out["attention_mask"]
    return out


def reference_rows(location):
    """Merged rows by (trajectory, first step) from the step layout."""
    rows = {}
    for b in drain_records(location, "ref"):
        t = b.record.to_pylist()
        by_traj = {}
        for s in t:
            by_traj.setdefault(s["trajectory_id"], []).append(s)
        for steps in by_traj.values():
            for r in ref_merge(sorted(steps, key=lambda s: s["step_index"])):
                rows[(r["traj"], r["first"])] = r
    return rows


@pytest.mark.parametrize("P,R", [(4096, 4096), (40, 96)])
def test_padded_matches_rllm_reference(serve_mt, P, R):
    ref = reference_rows(serve_mt("--consumer-group", f"steps-{P}").location)
    srv = serve_mt("--consumer-group", f"traj-{P}", "--layout", "trajectories", "--max-tokens", "20000")
    seen, resets, cut, token_adv, not_last, mixed, token_mixed = 0, 0, 0, 0, 0, 0, 0
    with Client(srv.location, consumer="t") as c:
        for b in c.batches():
            assert b.layout == "trajectories"
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = b.to_padded(PAD, P, R, mask_pad_token_ids=True)  # rLLM's rule, as the reference
            keys = list(zip(got.ids["trajectory_ids"], got.ids["first_step_index"]))
            rows = [ref[k] for k in keys]
            want = ref_pad(rows, PAD, P, R)
            for name in ("input_ids", "attention_mask", "position_ids", "prompts", "responses", "response_mask", "response_versions"):
                np.testing.assert_array_equal(getattr(got, name), want[name], err_msg=name)
            for name in ("rollout_log_probs", "advantages", "traj_rewards", "step_rewards"):
                np.testing.assert_allclose(getattr(got, name), want[name], rtol=0, atol=1e-6, err_msg=name)
            # the per-row ids, from the reference's own walk
            for name, of in (("last_step_index", lambda r: r["last"]), ("steps_merged", lambda r: r["merged"]),
                             ("segment", lambda r: r["segment"]), ("rows_in_trajectory", lambda r: r["rows_in_trajectory"]),
                             ("is_last_step", lambda r: r["is_last"]), ("policy_versions", lambda r: min(r["versions"]))):
                assert list(got.ids[name]) == [of(r) for r in rows], name
            assert list(b.column("max_policy_version").to_pylist()) == [max(r["versions"]) for r in rows]
            token_adv += sum(r["token_advantages"] for r in rows)
            not_last += sum(not r["is_last"] for r in rows)
            mixed += sum(min(r["versions"]) != max(r["versions"]) for r in rows)
            token_mixed += sum(
                len({v for v in r["tv"] if v >= 0}) > 1 and any(a != b for a, b in zip(r["tv"], r["tv"][1:]) if a >= 0 and b >= 0) for r in rows)
            # truncation is counted, never silent
            tr = got.truncation
            assert tr["prompts_truncated"] == sum(len(r["prompt"]) > P for r in rows)
            assert tr["responses_truncated"] == sum(len(r["response"]) > R for r in rows)
            assert tr["response_tokens_dropped"] == sum(max(0, len(r["response"]) - R) for r in rows)
            assert tr["action_tokens_dropped"] == sum(sum(r["mask"][R:]) for r in rows)
            assert list(got.response_truncated) == [len(r["response"]) > R for r in rows]
            truncated = tr["prompts_truncated"] + tr["responses_truncated"]
            assert any(issubclass(w.category, TruncationWarning) for w in caught) == (truncated > 0)
            cut += truncated
            resets += sum(r["first"] > 0 for r in rows)
            seen += len(keys)
            b.ack()
    assert seen == len(ref), "every merged row once"
    assert resets > 0, "the data has context resets"
    assert token_adv > 0, "the data has distillation token advantages"
    assert not_last > 0 and mixed > 0, "rows cut by a reset, rows of several policy versions"
    assert token_mixed > 0, "rows whose tokens change version within a step (token_versions)"
    if R < 4096:
        assert cut > 0, "the small lengths cut rows"


@pytest.mark.parametrize("multiple", [8, "wrap"])
def test_pad_rows_to_multiple_copies_real_rows_as_verl(serve_mt, multiple):
    """Padding rows are verl's pad_dataproto_to_divisor (row j copies real
    row j mod n), neutralised as rLLM's trainer does (response_mask 0,
    is_pad_step True, is_valid False, is_last_step False), with advantages
    and rewards 0: every padding row attends to real tokens."""
    srv = serve_mt("--consumer-group", f"multiple-{multiple}", "--layout", "trajectories", "--max-tokens", "6000")
    with Client(srv.location, consumer="t") as c:
        b = next(iter(c.batches()))
        n = b.num_rows
        # A data-parallel world size that does not divide n (8 unless the
        # batch happens to hold a multiple of 8 rows), so that there are
        # padding rows to check; "wrap": more padding rows than real ones.
        m = next(k for k in (8, 7, 6, 5, 3) if n % k) if multiple == 8 else 2 * n + 3
        plain = b.to_padded(PAD, 512, 1024)
        got = b.to_padded(PAD, 512, 1024, pad_rows_to_multiple=m)
        assert got.num_rows % m == 0 and got.num_rows >= n and got.num_rows - n < m
        n_pad = got.num_rows - n
        assert n_pad > (n if multiple == "wrap" else 0)
        assert list(got.is_pad) == [False] * n + [True] * n_pad
        assert list(got.is_valid) == [True] * n + [False] * n_pad
        assert got.truncation["pad_rows"] == n_pad and got.truncation["rows"] == n
        src = np.arange(n_pad) % n
        for name, a in plain.arrays().items():
            np.testing.assert_array_equal(getattr(got, name)[:n], a, err_msg=name)
        for name in ("input_ids", "attention_mask", "position_ids", "prompts", "responses", "rollout_log_probs", "traj_rewards", "step_rewards"):
            np.testing.assert_array_equal(getattr(got, name)[n:], getattr(plain, name)[src], err_msg=name)
        for name in ("response_mask", "advantages"):
            assert not getattr(got, name)[n:].any(), name
        assert (got.attention_mask[n:].sum(axis=1) > 0).all(), "no padding row is all masked"
        assert plain.advantages.any() and plain.traj_rewards.any(), "the copied rows had something to zero"
        for name, v in plain.ids.items():
            want = v[src] if name != "is_last_step" else np.zeros(n_pad, dtype=bool)
            assert list(got.ids[name][n:]) == list(want), name
            assert list(got.ids[name][:n]) == list(v), name
        np.testing.assert_array_equal(got.response_truncated[n:], plain.response_truncated[src])


def test_step_layout_pads_every_token_as_an_action(serve_mt):
    srv = serve_mt("--consumer-group", "steps-pad")
    with Client(srv.location, consumer="t") as c:
        b = next(iter(c.batches()))
        got = b.to_padded(PAD, 4096, 4096)
        rows = b.record.to_pylist()
        for i, s in enumerate(rows):
            n = len(s["response_ids"])
            assert got.response_mask[i].sum() == n
            adv = s["token_advantages"] if s["token_advantages"] is not None else [s["advantage"]] * n
            np.testing.assert_allclose(got.advantages[i, :n], adv, atol=1e-6)
            # rewards at the last token: the trajectory's, and the step's own
            assert got.traj_rewards[i, n - 1] == np.float32(s["reward"]) and got.traj_rewards[i].sum() == got.traj_rewards[i, n - 1]
            assert got.step_rewards[i, n - 1] == np.float32(s["step_reward"] or 0) and got.step_rewards[i].sum() == got.step_rewards[i, n - 1]


def test_positional_attention_mask(serve_mt):
    srv = serve_mt("--consumer-group", "positional", "--layout", "trajectories")
    with Client(srv.location, consumer="t") as c:
        b = next(iter(c.batches()))
        got = b.to_padded(PAD, 4096, 4096, mask_pad_token_ids=False)
        lengths = [len(p) + len(r) for p, r in zip(b.column("prompt_ids").to_pylist(), b.column("response_ids").to_pylist())]
        assert list(got.attention_mask.sum(axis=1)) == lengths
        assert got.truncation["pad_id_tokens"] == int(sum(
            (np.array(p) == PAD).sum() + (np.array(r) == PAD).sum()
            for p, r in zip(b.column("prompt_ids").to_pylist(), b.column("response_ids").to_pylist())))


def test_torch_tensors_share_memory(serve_mt):
    torch = pytest.importorskip("torch")
    srv = serve_mt("--consumer-group", "torch-pad", "--layout", "trajectories")
    with Client(srv.location, consumer="t") as c:
        got = next(iter(c.batches())).to_padded(PAD, 256, 512)
        t = got.torch()
        assert t["input_ids"].dtype == torch.int64
        assert t["input_ids"].data_ptr() == got.input_ids.__array_interface__["data"][0]


# --- the iterable dataset: acknowledged after the optimizer step -------------


def test_dataset_acks_after_the_step_with_the_policy_version(serve_mt):
    from rllm_pipe.dataset import PaddedBatches

    srv = serve_mt("--consumer-group", "ds", "--layout", "trajectories", "--max-tokens", "30000")
    data = PaddedBatches(srv.location, "trainer", pad_token_id=PAD, max_prompt_length=512, max_response_length=2048, policy_version=3)
    seen = []
    for n, step in enumerate(data):
        assert step.policy_version == 3 + n, "each optimizer step made a version"
        with step:
            assert not step.acked, "nothing is acknowledged before the step is done"
            assert step.padded.input_ids.shape[1] == 512 + 2048
            assert step.staleness["max"] >= 0
            seen += step.batch.groups
        assert step.acked and step.ack_result["lost"] == 0
        # the acknowledgement carried the version the optimizer step made
        assert data.policy_version == data.client.stats()["policy_version"] == 3 + n + 1
    assert data.stats["acked"] == data.stats["batches"] == n + 1
    assert sorted(seen) == sorted(set(seen)) and len(seen) == data.stats["groups_acked"] == 24


def test_dataset_steps_of_exact_groups_split_by_the_token_budget(serve_mt):
    """The trainer asks for 5 groups a step (its ticket); the server caps a
    batch at a token budget of about two groups: every step holds exactly 5
    groups (the last 4: the end of the input), in micro-batches of whole
    groups within the budget, acknowledged together."""
    from rllm_pipe.dataset import PaddedBatches

    one = drain_records(serve_mt("--consumer-group", "ds-sizes", "--layout", "trajectories").location, "sizes")
    tokens = {b.groups[0]: b.tokens_total for b in one}
    budget = 2 * max(tokens.values())
    srv = serve_mt("--consumer-group", "ds-steps", "--layout", "trajectories", "--max-tokens", str(budget))
    data = PaddedBatches(srv.location, "trainer", pad_token_id=PAD, max_prompt_length=4096, max_response_length=4096,
                         batch_groups=5)
    sizes, seen, split = [], [], 0
    for step in data:
        with step:
            sizes.append(len(step.groups))
            seen += step.groups
            parts = [b.step for b in step.batches]
            assert [p["part"] for p in parts] == list(range(len(parts))) and {p["parts"] for p in parts} == {len(parts)}
            assert all(p["groups"] == len(step.groups) for p in parts) and len({p["step"] for p in parts}) == 1
            for b, m in zip(step.batches, step.micro_batches):
                assert b.tokens_total == sum(tokens[g] for g in b.groups)
                assert b.tokens_total <= budget or len(b.groups) == 1
                assert m.truncation["rows"] == b.num_rows
            if len(step.batches) > 1:
                split += 1
                with pytest.raises(ValueError):
                    step.padded
            else:
                assert step.padded is step.micro_batches[0]
    assert sizes == [5, 5, 5, 5, 4], sizes
    assert split > 0, "no step went over the budget: the test needs one"
    assert sorted(seen) == sorted(tokens) and data.stats["groups_acked"] == 24
    assert data.stats["micro_batches"] > data.stats["batches"] == 5


def test_dataset_versions_managed_by_the_trainer(serve_mt):
    from rllm_pipe.dataset import PaddedBatches

    srv = serve_mt("--consumer-group", "ds-versions", "--layout", "trajectories", "--max-tokens", "30000")
    data = PaddedBatches(srv.location, "trainer", pad_token_id=PAD, max_prompt_length=512, max_response_length=2048,
                         policy_version=5, versions_per_step=0)
    for n, step in enumerate(data):
        if n == 0:
            step.ack()  # versions_per_step=0: the version stays
            assert data.policy_version == data.client.stats()["policy_version"] == 5
        else:
            step.ack(policy_version=10 + n)  # an explicit version becomes the dataset's
            assert data.policy_version == data.client.stats()["policy_version"] == 10 + n
    assert n >= 1
    with pytest.raises(ValueError):
        PaddedBatches(srv.location, "x", pad_token_id=PAD, max_prompt_length=8, max_response_length=8, versions_per_step=-1)


def test_dataset_refuses_to_move_on_without_an_ack(serve_mt):
    from rllm_pipe.dataset import PaddedBatches, UnackedBatch

    srv = serve_mt("--consumer-group", "ds-unacked", "--layout", "trajectories", "--max-tokens", "30000")
    data = PaddedBatches(srv.location, "trainer", pad_token_id=PAD, max_prompt_length=512, max_response_length=2048)
    it = iter(data)
    first = next(it)
    with pytest.raises(RuntimeError):
        with first:
            raise RuntimeError("the optimizer step failed")
    assert not first.acked, "a failed step is not acknowledged"
    with pytest.raises(UnackedBatch):
        next(it)
    # the stream ended: the unacknowledged batch went back to the group
    again = PaddedBatches(srv.location, "trainer", pad_token_id=PAD, max_prompt_length=512, max_response_length=2048)
    groups = []
    for step in again:
        groups += step.batch.groups
        step.ack()
    assert set(first.batch.groups) <= set(groups) and len(groups) == 24


def test_example_trains_and_acknowledges():
    import subprocess
    import sys

    from conftest import BIN, REPO, example_env

    ex = REPO / "train" / "python" / "examples" / "train_tiny.py"
    out = subprocess.run([sys.executable, str(ex), "--bin", BIN, "--steps", "3"], check=True, capture_output=True, text=True, timeout=120,
                         env=example_env()).stdout
    lines = [l for l in out.splitlines() if l.startswith("step ")]
    assert len(lines) == 3 and all("'lost': 0" in l for l in lines), out
    assert "'acked': 3" in out.splitlines()[-1], out


@pytest.mark.parametrize("bound", [1, 2])
def test_example_staleness_stays_within_max_staleness(bound):
    """The acknowledgement reports the version the optimizer step made, so
    serve forms the next batch against the weights that train on it: every
    batch's staleness as trained on is within --max-staleness (reporting the
    version from before the step gave max-staleness + 1)."""
    import re
    import subprocess
    import sys

    from conftest import BIN, REPO, example_env

    ex = REPO / "train" / "python" / "examples" / "train_tiny.py"
    out = subprocess.run([sys.executable, str(ex), "--bin", BIN, "--steps", "8", "--max-staleness", str(bound)],
                         check=True, capture_output=True, text=True, timeout=120, env=example_env()).stdout
    steps = [re.search(r"policy_version=(\d+) staleness max=(\d+) .* acked_version=(\d+)", l) for l in out.splitlines() if l.startswith("step ")]
    assert len(steps) >= bound + 1 and all(steps), out
    stale = [int(m.group(2)) for m in steps]
    assert max(stale) == bound, f"the bound is reached and holds: {stale}"
    assert all(int(m.group(3)) == int(m.group(1)) + 1 for m in steps), "each ack reported the version after the step"
    assert all(int(b.group(1)) == int(a.group(3)) for a, b in zip(steps, steps[1:])), "the next batch trains on the acked version"


def test_out_reuses_the_arrays_of_an_earlier_result(serve_mt):
    srv = serve_mt("--consumer-group", "reuse", "--layout", "trajectories", "--max-tokens", "8000")
    batches = drain_records(srv.location, "t")
    assert len(batches) > 2
    prev = batches[0].to_padded(PAD, 64, 128, pad_rows_to_multiple=4, warn=False)
    reused = 0
    for b in batches[1:] + batches[:1]:
        fresh = b.to_padded(PAD, 64, 128, pad_rows_to_multiple=4, warn=False)
        held = prev._buffers["input_ids"]  # the earlier result's arrays, at full size
        got = b.to_padded(PAD, 64, 128, pad_rows_to_multiple=4, warn=False, out=prev)
        for name, a in fresh.arrays().items():
            np.testing.assert_array_equal(getattr(got, name), a, err_msg=name)
        assert got.truncation == fresh.truncation
        # reused when the rows fit in the earlier arrays, new memory otherwise
        assert np.shares_memory(got.input_ids, held) == (got.num_rows <= held.shape[0])
        reused += got.num_rows <= held.shape[0]
        prev = got
    assert reused > 0


# --- attention mask and position ids, pinned by hand -------------------------


def _merged_record(rows):
    """A record of merged rows (only the columns to_padded reads)."""
    import pyarrow as pa

    i32, i8, f32 = pa.list_(pa.int32()), pa.list_(pa.int8()), pa.list_(pa.float32())
    return pa.RecordBatch.from_arrays(
        [pa.array([r[0] for r in rows], i32), pa.array([r[1] for r in rows], i32), pa.array([r[2] for r in rows], i8),
         pa.array([[-0.5] * len(r[1]) for r in rows], f32), pa.array([[2.0] * len(r[1]) for r in rows], f32),
         pa.array([1.0] * len(rows), pa.float64())],
        names=["prompt_ids", "response_ids", "response_mask", "rollout_log_probs", "advantages", "reward"])


def test_attention_and_positions_follow_rllm_and_verl():
    from rllm_pipe.padded import to_padded

    # pad id 0; row 0 holds a real 0 in its prompt and as its last action,
    # row 1's prompt is cut to its last 4 tokens.
    rec = _merged_record([([5, 0, 7], [8, 9, 0], [1, 0, 1]), ([1, 2, 3, 4, 6], [3], [1])])
    ids = [[0, 5, 0, 7, 8, 9, 0, 0, 0], [2, 3, 4, 6, 3, 0, 0, 0, 0]]

    # rLLM's transform, asked for: attention = token != pad id (prompts and
    # responses), positions = (cumsum(attention) - 1) * attention.
    got = to_padded(rec, 0, 4, 5, warn=False, mask_pad_token_ids=True)
    np.testing.assert_array_equal(got.input_ids, ids)
    np.testing.assert_array_equal(got.attention_mask, [[0, 1, 0, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(got.position_ids, [[0, 0, 0, 1, 2, 3, 0, 0, 0], [0, 1, 2, 3, 4, 0, 0, 0, 0]])
    # the response mask is the merge's, not cut by the attention (as rLLM)
    np.testing.assert_array_equal(got.response_mask, [[1, 0, 1, 0, 0], [1, 0, 0, 0, 0]])
    assert got.truncation["pad_id_tokens"] == 2
    assert got.prompts.base is not None and np.shares_memory(got.prompts, got.input_ids)

    # The default, as verl's agent loop: attention from the lengths
    # (tokenizer.pad), so a real token equal to the pad id keeps its
    # position; padding positions are 0 (verl's clip(cumsum - 1, 0) repeats
    # the last position on the right padding instead; both are masked out).
    got = to_padded(rec, 0, 4, 5, warn=False)
    assert all(np.array_equal(a, b) for a, b in zip(got.arrays().values(), to_padded(rec, 0, 4, 5, warn=False, mask_pad_token_ids=False).arrays().values()))
    np.testing.assert_array_equal(got.input_ids, ids)
    np.testing.assert_array_equal(got.attention_mask, [[0, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(got.position_ids, [[0, 0, 1, 2, 3, 4, 5, 0, 0], [0, 1, 2, 3, 4, 0, 0, 0, 0]])
    np.testing.assert_array_equal(got.advantages, [[2, 0, 2, 0, 0], [2, 0, 0, 0, 0]])
    np.testing.assert_array_equal(got.traj_rewards, [[0, 0, 1, 0, 0], [1, 0, 0, 0, 0]])
    assert got.truncation["pad_id_tokens"] == 2 and got.truncation["prompt_tokens_dropped"] == 1


def test_truncated_responses_reward_as_rllm_or_verl():
    from rllm_pipe.padded import to_padded

    # row 0's response (3 tokens, the last one the pad id) is cut to 2; row 1 fits.
    rec = _merged_record([([5, 0, 7], [8, 9, 0], [1, 0, 1]), ([1, 2], [3], [1])])
    rllm = to_padded(rec, 0, 4, 2, warn=False)  # the default: no reward for a cut response
    np.testing.assert_array_equal(rllm.traj_rewards, [[0, 0], [1, 0]])
    np.testing.assert_array_equal(rllm.step_rewards, [[0, 0], [1, 0]])
    verl = to_padded(rec, 0, 4, 2, warn=False, truncated_reward="last_kept")
    np.testing.assert_array_equal(verl.traj_rewards, [[0, 1], [1, 0]])
    np.testing.assert_array_equal(verl.step_rewards, [[0, 1], [1, 0]])
    assert rllm.truncation == verl.truncation and rllm.truncation["responses_truncated"] == 1
    # everything else is the same
    for k, a in rllm.arrays().items():
        if k not in ("traj_rewards", "step_rewards"):
            np.testing.assert_array_equal(a, verl.arrays()[k], err_msg=k)
    with pytest.raises(ValueError):
        to_padded(rec, 0, 4, 2, truncated_reward="verl")


def test_pad_id_inside_prompts_and_responses_by_default(serve_mt):
    """Generated multi-turn data where the pad id (0) is a real token inside
    prompts and responses: with default arguments the attention mask is the
    rows' lengths, no hole in it (verl derives response lengths from it)."""
    srv = serve_mt("--consumer-group", "pad-inside", "--layout", "trajectories")
    holes = 0
    with Client(srv.location, consumer="t") as c:
        for b in c.batches():
            got = b.to_padded(PAD, 4096, 4096)
            prompts, responses = b.column("prompt_ids").to_pylist(), b.column("response_ids").to_pylist()
            holes += sum(int((np.array(p) == PAD).sum() + (np.array(r) == PAD).sum()) for p, r in zip(prompts, responses))
            np.testing.assert_array_equal(got.attention_mask[:, :4096].sum(axis=1), [len(p) for p in prompts])
            np.testing.assert_array_equal(got.attention_mask[:, 4096:].sum(axis=1), [len(r) for r in responses])
            # contiguous: left-padded prompts, right-padded responses
            for i, (p, r) in enumerate(zip(prompts, responses)):
                assert got.attention_mask[i, 4096 - len(p):4096 + len(r)].all()
            b.ack()
    assert holes > 0, "the data must hold the pad id inside rows for this test to mean anything"


def test_dataset_reuse_arrays(serve_mt):
    from rllm_pipe.dataset import PaddedBatches

    def run_(group, reuse):
        srv = serve_mt("--consumer-group", group, "--layout", "trajectories", "--max-tokens", "8000")
        data = PaddedBatches(srv.location, "trainer", pad_token_id=PAD, max_prompt_length=64, max_response_length=256,
                             pad_rows_to_multiple=64, padding={"warn": False}, reuse_arrays=reuse)
        steps = []
        for step in data:
            with step:
                p = step.padded
                steps.append(({k: a.copy() for k, a in p.arrays().items()}, p.input_ids.__array_interface__["data"][0]))
        return steps

    fresh, reused = run_("ds-fresh", False), run_("ds-reuse", True)
    assert len(fresh) == len(reused) > 2
    for (want, _), (got, _) in zip(fresh, reused):
        assert want.keys() == got.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert len({ptr for _, ptr in reused}) == 1, "every step wrote into the first step's arrays"


def test_step_rewards_follow_rllm():
    """rLLM's step_rewards: a merged row's is its trajectory reward (equal to
    traj_rewards); a step row's is the step's own reward, 0 when it has
    none. Both sit at the last response token, only when the response fits."""
    import pyarrow as pa

    from rllm_pipe.padded import to_padded

    merged = to_padded(_merged_record([([1], [2, 3], [1, 1]), ([4], [5, 6, 7, 8], [1, 0, 0, 1])]), 0, 2, 3, warn=False)
    np.testing.assert_array_equal(merged.step_rewards, merged.traj_rewards)
    np.testing.assert_array_equal(merged.step_rewards, [[0, 1, 0], [0, 0, 0]])  # row 1 is cut: no reward, as rLLM

    i32, f32 = pa.list_(pa.int32()), pa.list_(pa.float32())
    steps = pa.RecordBatch.from_arrays(
        [pa.array([[1], [2], [3]], i32), pa.array([[4, 5], [6], [7, 8]], i32), pa.array([[0.0, 0.0], [0.0], [0.0, 0.0]], f32),
         pa.array([1.0, 1.0, 0.0]), pa.array([0.25, None, -1.0]), pa.array([0.5, 0.5, 0.5])],
        names=["prompt_ids", "response_ids", "response_logprobs", "reward", "step_reward", "advantage"])
    got = to_padded(steps, 0, 2, 3, warn=False)
    np.testing.assert_array_equal(got.traj_rewards, [[0, 1, 0], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(got.step_rewards, [[0, 0.25, 0], [0, 0, 0], [0, -1, 0]])


def test_old_log_probs_where_present():
    """No rllm-pipe layout carries old_log_probs yet; a record that has an
    old_log_probs list column (one item per response token) gets the tensor:
    right-padded with 0, cut with the response, copied by padding rows, and
    written into the arrays of an earlier result with out=."""
    import pyarrow as pa

    from rllm_pipe.padded import to_padded

    rows = [([1, 2], [3, 4, 5], [1, 0, 1]), ([6], [7, 8, 9, 10, 11], [1, 1, 0, 0, 1]), ([12], [13], [1])]
    old = [[-0.1, -0.2, -0.3], [-1.0, -1.1, -1.2, -1.3, -1.4], [-2.0]]
    base = _merged_record(rows)
    rec = base.append_column("old_log_probs", pa.array(old, pa.list_(pa.float32())))
    assert to_padded(base, 0, 2, 4, warn=False).old_log_probs is None, "absent: None"
    assert "old_log_probs" not in to_padded(base, 0, 2, 4, warn=False).arrays()

    got = to_padded(rec, 0, 2, 4, pad_rows_to_multiple=4, warn=False)
    want = np.array([[-0.1, -0.2, -0.3, 0], [-1.0, -1.1, -1.2, -1.3], [-2.0, 0, 0, 0], [-0.1, -0.2, -0.3, 0]], dtype=np.float32)
    np.testing.assert_array_equal(got.old_log_probs, want)  # row 1 cut to 4 tokens; row 3 copies row 0
    assert got.old_log_probs.dtype == np.float32 and got.arrays()["old_log_probs"] is got.old_log_probs
    assert got.truncation["responses_truncated"] == 1 and got.truncation["response_tokens_dropped"] == 1

    # out=: the earlier result's arrays are overwritten with the new rows
    again = to_padded(rec.slice(1, 2), 0, 2, 4, pad_rows_to_multiple=4, warn=False, out=got)
    assert np.shares_memory(again.old_log_probs, want) is False and np.shares_memory(again.old_log_probs, got._buffers["old_log_probs"])
    np.testing.assert_array_equal(again.old_log_probs, want[[1, 2, 1, 2]])

    bad = base.append_column("old_log_probs", pa.array([[0.0]] * 3, pa.list_(pa.float32())))
    with pytest.raises(ValueError, match="old_log_probs"):
        to_padded(bad, 0, 2, 4, warn=False)
