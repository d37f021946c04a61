import threading

import numpy as np
import pytest

from rllm_pipe import Client

from conftest import committed_groups


def drain(client, seen, budget=None, on_batch=None):
    for batch in client.batches():
        ids = batch.column("group_id").to_pylist()
        assert set(ids) == set(batch.groups), "a batch holds exactly the groups it lists"
        if budget is not None and batch.tokens_total > budget:
            assert batch.oversized and len(batch.groups) == 1
        for g in batch.groups:
            seen.append(g)
        if on_batch:
            on_batch(batch)
        res = batch.ack()
        assert res["lost"] == 0


def test_every_group_once_within_budget(serve, shards):
    want = committed_groups(shards)
    srv = serve("--consumer-group", "once", "--max-tokens", "6000")
    seen = []
    with Client(srv.location, consumer="t0") as c:
        drain(c, seen, budget=6000)
    assert sorted(seen) == sorted(want), "every committed group, each exactly once"


def test_token_counts_match_the_shards(serve, shards):
    want = committed_groups(shards)
    srv = serve("--consumer-group", "tokens")  # one group per batch
    with Client(srv.location, consumer="t0") as c:
        for batch in c.batches():
            (g,) = batch.groups
            p, r = batch.tokens("prompt_ids"), batch.tokens("response_ids")
            assert int(p.lengths().sum() + r.lengths().sum()) == batch.tokens_total == want[g][1]
            batch.ack()


def test_tokens_are_numpy_views_of_the_arrow_buffers(serve):
    srv = serve("--consumer-group", "zerocopy", "--max-tokens", "20000")
    with Client(srv.location, consumer="t0") as c:
        batch = next(iter(c.batches()))
        arr = batch.column("response_ids")
        col = batch.tokens("response_ids")
        assert col.values.dtype == np.int32 and col.offsets.dtype == np.int32
        # The numpy array points into the Arrow values buffer: no copy.
        buf = arr.values.buffers()[1]
        assert col.values.__array_interface__["data"][0] == buf.address + arr.values.offset * 4
        assert not col.values.flags.writeable
        assert list(col.row(0)) == arr[0].as_py()
        lp = batch.tokens("response_logprobs")
        assert lp.values.dtype == np.float32
        assert len(lp.values) == len(col.values)


def test_torch_tensors_share_memory(serve):
    torch = pytest.importorskip("torch")
    srv = serve("--consumer-group", "torch")
    with Client(srv.location, consumer="t0") as c:
        batch = next(iter(c.batches()))
        ids, offsets = batch.tensors("response_ids")
        col = batch.tokens("response_ids")
        assert ids.dtype == torch.int32
        assert ids.data_ptr() == col.values.__array_interface__["data"][0]


def test_two_members_share_without_overlap(serve, shards):
    want = committed_groups(shards)
    srv = serve("--consumer-group", "shared", "--max-tokens", "4000")
    seen = {"a": [], "b": []}

    def member(name):
        with Client(srv.location, consumer=name) as c:
            drain(c, seen[name], budget=4000)

    threads = [threading.Thread(target=member, args=(n,)) for n in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not set(seen["a"]) & set(seen["b"]), "members receive disjoint groups"
    assert sorted(seen["a"] + seen["b"]) == sorted(want)


def test_unacknowledged_batches_go_to_the_next_member(serve, shards):
    want = committed_groups(shards)
    srv = serve("--consumer-group", "handover")
    acked, unacked = [], []
    with Client(srv.location, consumer="first") as c:
        for i, batch in enumerate(c.batches()):
            if i < 5:
                batch.ack()
                acked += batch.groups
            else:
                unacked += batch.groups  # the trainer dies holding it
                break
    rest = []
    with Client(srv.location, consumer="second") as c:
        drain(c, rest)
    assert set(unacked) <= set(rest), "an unacknowledged batch is delivered again"
    assert not set(acked) & set(rest), "an acknowledged batch never is"
    assert sorted(acked + rest) == sorted(want)


def test_policy_version_updates_skip_stale_groups(serve, shards):
    want = committed_groups(shards)
    versions = sorted({v for v, _ in want.values()})
    assert len(versions) > 1, "the generated traces span several policy versions"
    top = versions[-1]
    # One batch in flight: the batch formed after an acknowledgement is judged
    # by the version reported with it.
    srv = serve("--consumer-group", "stale", "--max-staleness", "0", "--max-inflight", "1")
    got = []
    with Client(srv.location, consumer="t0", policy_version=versions[0]) as c:
        for i, batch in enumerate(c.batches()):
            vs = set(batch.column("group_version").to_pylist())
            assert all(c.policy_version - v <= 0 for v in vs), (vs, c.policy_version)
            got += batch.groups
            if i == 2:
                batch.ack(policy_version=top)  # the trainer moved on
            else:
                batch.ack()
        stats = c.stats()
    # After the update only groups of the newest version pass.
    later = got[3:]
    assert all(want[g][0] == top for g in later)
    assert stats["groups_skipped_stale"] == len(want) - len(got)
    assert stats["groups_skipped_stale"] > 0
