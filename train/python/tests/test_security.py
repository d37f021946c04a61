"""The client against a serve that authenticates (bearer tokens), speaks TLS,
and binds every action to the stream it belongs to."""

import json
import shutil
import subprocess

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from rllm_pipe import Client

from conftest import BIN, committed_groups
from test_client import drain

TOKEN = "member-token-5f0c1a9e3b7d"
ADMIN = "admin-token-8e2b4c6d0a1f"


@pytest.fixture
def tokens(tmp_path):
    """Token files for --token-file and --admin-token-file."""
    member, admin = tmp_path / "token", tmp_path / "admin-token"
    member.write_text(TOKEN + "\n")
    admin.write_text(ADMIN + "\n")
    return ["--token-file", str(member), "--admin-token-file", str(admin)]


def test_token_is_required(serve, shards, tokens):
    want = committed_groups(shards)
    srv = serve("--consumer-group", "auth", *tokens)
    for bad in (None, "wrong-token", TOKEN + "x"):
        with Client(srv.location, consumer="intruder", token=bad) as c:
            with pytest.raises(flight.FlightUnauthenticatedError):
                next(iter(c.batches()))
    seen = []
    with Client(srv.location, consumer="t0", token=TOKEN) as c:
        drain(c, seen)
    assert sorted(seen) == sorted(want)


def test_token_from_the_environment(serve, tokens, monkeypatch):
    srv = serve("--consumer-group", "env", env={"RLLM_PIPE_TOKEN": TOKEN})
    monkeypatch.setenv("RLLM_PIPE_TOKEN", TOKEN)
    with Client(srv.location, consumer="t0") as c:
        stream = c.batches()  # held: the stream stays open
        batch = next(stream)
        assert batch.ack()["groups"] == len(batch.groups)
    monkeypatch.delenv("RLLM_PIPE_TOKEN")
    with Client(srv.location, consumer="t1") as c:
        with pytest.raises(flight.FlightUnauthenticatedError):
            next(iter(c.batches()))


def _self_signed(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return cert, key


def test_tls_with_the_ca(serve, shards, tokens, tmp_path):
    cert, key = _self_signed(tmp_path)
    want = committed_groups(shards)
    srv = serve("--consumer-group", "tls", "--tls-cert", str(cert), "--tls-key", str(key), *tokens)
    seen = []
    with Client(srv.location, consumer="t0", token=TOKEN, tls_root_certs=str(cert)) as c:
        drain(c, seen)
    assert sorted(seen) == sorted(want)
    # The CA as bytes: every group is done, so the stream ends at once.
    with Client(srv.location, consumer="t1", token=TOKEN, tls_root_certs=cert.read_bytes()) as c:
        assert list(c.batches()) == []
        assert c.stats()["batches"] == 0
    # Plaintext to a TLS server fails.
    with Client(srv.location, consumer="t2", token=TOKEN) as c:
        with pytest.raises(flight.FlightError):
            next(iter(c.batches()))


def test_actions_bound_to_the_stream(serve, tokens):
    srv = serve("--consumer-group", "bound", "--max-staleness", "0", *tokens)
    with Client(srv.location, consumer="victim", token=TOKEN, policy_version=0) as victim:
        it = iter(victim.batches())
        first = next(it)
        hostile = flight.FlightClient(srv.location)
        opts = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer " + TOKEN.encode())])

        def act(kind, body):
            return list(hostile.do_action(flight.Action(kind, json.dumps(body).encode()), opts))

        for kind, body in [
            ("set_policy_version", {"consumer": "victim", "policy_version": 1000}),
            ("ack", {"consumer": "victim", "batch_ids": [], "policy_version": 1000}),
            ("ack", {"consumer": "victim", "batch_ids": [first.batch_id]}),
            ("stats", {"consumer": "victim"}),
            ("stats", {}),
        ]:
            with pytest.raises(flight.FlightUnauthorizedError):
                act(kind, body)
        st = victim.stats()
        assert st["policy_version"] == 0 and st["groups_acked"] == 0
        # The victim itself still acts on its stream.
        assert first.ack(policy_version=1)["lost"] == 0
        victim.set_policy_version(2)
        assert victim.stats()["policy_version"] == 2
        hostile.close()


def test_admin_token_reads_every_member(serve, tokens):
    srv = serve("--consumer-group", "admin", *tokens)
    with Client(srv.location, consumer="t0", token=TOKEN) as c:
        stream = c.batches()  # held: the stream stays open
        next(stream)
        with pytest.raises(flight.FlightUnauthorizedError):
            c.stats(consumer="")
        with Client(srv.location, token=ADMIN) as admin:
            assert "t0" in admin.stats(consumer="")
            assert admin.stats(consumer="t0")["member"].startswith("t0/")


def test_policy_versions_out_of_range(serve):
    srv = serve("--consumer-group", "range")
    for v in (-1, 2**60):
        with Client(srv.location, consumer="t0", policy_version=v) as c:
            with pytest.raises((pa.ArrowInvalid, flight.FlightError)):
                next(iter(c.batches()))
    with Client(srv.location, consumer="t1") as c:
        stream = c.batches()
        next(stream)
        with pytest.raises((pa.ArrowInvalid, flight.FlightError)):
            c.set_policy_version(-5)


def test_beyond_loopback_needs_a_token(shards):
    res = subprocess.run([BIN, "serve", "--from", str(shards), "--listen", "0.0.0.0:0"], capture_output=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 2
    assert b"beyond loopback" in res.stderr and b"token" in res.stderr
