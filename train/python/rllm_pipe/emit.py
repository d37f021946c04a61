"""Turn rLLM Episodes into rllm-pipe wire records and send them.

rLLM's engine holds its rollouts as ``Episode`` objects (``rllm.types`` /
``rllm.agents.agent``: Episode -> Trajectory -> Step with token ids,
logprobs and a weight version). This module turns one, or a plain dict of
the same shape (``Episode.to_dict()``, ``model_dump()``, an ``rllm eval``
episode file), into Step and Trajectory records of the wire format
(``schemas/README.md``), with the same ids ``rllm-pipe import rllm`` gives
the same data, so a record sent twice (a retry, or an import of the same
episodes) is dropped downstream as a duplicate. Here ``gateway`` is the
capture gateway's address (``"http://127.0.0.1:8816"``, the default of
``rllm-pipe gateway``):

    >>> from rllm_pipe.emit import episode_records, post_records, write_records
    >>> episode = {"id": "task-7:0", "trajectories": [{"uid": "task-7:0/a", "reward": 1.0, "steps": [
    ...     {"prompt_ids": [1, 2, 3], "response_ids": [4, 5], "logprobs": [-0.1, -0.7]}]}]}
    >>> records = episode_records(episode, policy_version=7)
    >>> [(r["type"], r["task_id"], r["trajectory_id"], r.get("step_id")) for r in records]
    [('step', 'task-7', 'task-7:0/a', 'task-7:0/a#0'), ('trajectory', 'task-7', 'task-7:0/a', None)]
    >>> post_records(records, gateway)          # the gateway's POST /records; the number accepted
    2
    >>> write_records(records, "traces.jsonl")  # or for `rllm-pipe ingest --from traces.jsonl`
    2

Only the standard library is used; rllm itself need not be installed.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Iterable, List, Mapping, Optional, TextIO, Union

__all__ = ["InvalidEpisode", "episode_records", "post_records", "write_records", "TOKEN_ENV"]

# Environment variables the token is read from when none is given, in order:
# the gateway's POST /records is a management route (its admin token). The
# RLLM_GATEWAY_* names are those of releases before 0.1.0, still read.
TOKEN_ENV = ("RLLM_PIPE_GATEWAY_ADMIN_TOKEN", "RLLM_PIPE_GATEWAY_AGENT_TOKEN",
             "RLLM_GATEWAY_ADMIN_TOKEN", "RLLM_GATEWAY_AGENT_TOKEN")

_DEFAULT_TRAJ_NAME = "default_traj_name"


class InvalidEpisode(ValueError):
    """A step the pipeline would reject (the ``reason`` is its dead-letter
    code): raised rather than sent shortened or guessed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__("%s: %s" % (reason, message))
        self.reason = reason


def _get(obj, name, default=None):
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _list(v):
    if v is None:
        return []
    if hasattr(v, "tolist"):  # numpy arrays, torch tensors
        v = v.tolist()
    return list(v)


def _id(v):
    if isinstance(v, bool) or v is None:
        return ""
    if isinstance(v, (str, int)):
        return str(v)
    return ""


def _termination(v):
    if v is None:
        return None
    v = getattr(v, "value", v)  # rLLM's TerminationReason enum
    return str(v) if v != "" else None


def _task_id(ep_id, task):
    if ":" in ep_id[1:]:
        return ep_id[: ep_id.rindex(":")]
    tid = _id(_get(task, "id")) if task is not None and not isinstance(task, str) else ""
    return tid or ep_id


def _finite(name, v, where):
    if v is None:
        return None
    v = float(v)
    if math.isnan(v) or math.isinf(v):
        raise InvalidEpisode("non_finite", "%s: %s is %r" % (where, name, v))
    return v


def _messages(v):
    if v is None:
        return None
    out = []
    for m in v:
        if not isinstance(m, dict) and hasattr(m, "to_dict"):
            m = m.to_dict()
        out.append(m)
    return out


def episode_records(episode: Any, policy_version: Optional[int] = None, group_size: Optional[int] = None,
                    deltas: bool = False) -> List[Dict[str, Any]]:
    """Return the wire records (dicts) of one rLLM Episode.

    ``episode`` is an object with the attributes of rLLM's Episode,
    Trajectory and Step, or a dict of the same keys. Ids: the task id is
    the episode id up to its last ``:`` (rLLM's ``{task_id}:{rollout_idx}``),
    else the task's ``id``, else the episode id; a trajectory's id is its
    ``uid`` (else ``{episode_id}/{index}``); a step's id is its ``id`` (else
    ``{trajectory_id}#{index}``); a named trajectory is the record's role,
    so the group is ``{task_id}:{name}`` as in rLLM's trainer. The
    episode's ``is_correct`` and ``termination_reason`` go on each of its
    trajectories.

    ``policy_version`` is used for steps without a ``weight_version``;
    ``group_size`` is written on each trajectory record when given.

    ``deltas=True`` sends multi-turn prompts as deltas (the wire format's
    ``prompt_delta_ids`` + ``parent_step_id``): a step whose prompt begins
    with the previous step's prompt and response, token for token, carries
    only the tokens after them, and then its messages, when they begin
    with the previous step's, only those added (``messages_added``). What
    rllm-pipe stores is the same as for whole records sent the same way
    (``write_records`` and ``post_records`` write compact JSON; other
    separators change only the whitespace of the stored messages text);
    the bytes sent and parsed shrink with the turns. Send a record's retries with the same
    setting: a step sent once whole and once as a delta is two different
    contents of one step_id (dead-lettered as ``duplicate_conflict``), and
    ``rllm-pipe import rllm`` writes whole records.

    Raises InvalidEpisode for a step the pipeline would reject: a null
    logprob entry, logprobs not one per response token, no policy version,
    a non-finite reward, a trajectory without a reward.
    """
    ep_id = _id(_get(episode, "id")) or ""
    if not ep_id:
        raise InvalidEpisode("missing_field", "episode has no id")
    task = _task_id(ep_id, _get(episode, "task"))
    is_correct = _get(episode, "is_correct")
    term = _termination(_get(episode, "termination_reason"))
    records = []
    for ti, traj in enumerate(_list(_get(episode, "trajectories"))):
        traj_id = _id(_get(traj, "uid")) or "%s/%d" % (ep_id, ti)
        name = _get(traj, "name") or ""
        role = name if name != _DEFAULT_TRAJ_NAME else ""
        steps = _list(_get(traj, "steps"))
        prev = None
        for si, step in enumerate(steps):
            rec = _step_record(step, si, task, role, traj_id, policy_version)
            whole = (rec["prompt_ids"], rec["response_ids"], rec.get("messages"))
            if deltas and prev is not None:
                _as_delta(rec, prev)
            records.append(rec)
            prev = (rec["step_id"],) + whole
        reward = _finite("reward", _get(traj, "reward"), "trajectory %s" % traj_id)
        if reward is None:
            raise InvalidEpisode("missing_field", "trajectory %s has no reward" % traj_id)
        rec = {"type": "trajectory", "trajectory_id": traj_id, "task_id": task, "reward": reward, "num_steps": len(steps)}
        if role:
            rec["role"] = role
        if term:
            rec["termination_reason"] = term
        if is_correct is not None:
            rec["is_correct"] = bool(is_correct)
        signals = _get(traj, "signals")
        if signals:
            rec["signals"] = {str(k): _finite("signal", v, "trajectory %s" % traj_id) for k, v in dict(signals).items()}
        if group_size:
            rec["group_size"] = int(group_size)
        meta = {"source": "rllm-episode", "episode_id": ep_id}
        if name:
            meta["trajectory_name"] = name
        rec["metadata"] = meta
        records.append(rec)
    return records


def _step_record(step, index, task, role, traj_id, policy_version):
    step_id = _id(_get(step, "id")) or "%s#%d" % (traj_id, index)
    where = "step %s" % step_id
    mo = _get(step, "model_output")
    prompt = _list(_get(step, "prompt_ids"))
    response = _list(_get(step, "response_ids"))
    logprobs = _list(_get(step, "logprobs"))
    version = _get(step, "weight_version")
    finish = None
    if mo is not None:  # rLLM backfills empty token fields from model_output
        prompt = prompt or _list(_get(mo, "prompt_ids"))
        response = response or _list(_get(mo, "completion_ids"))
        logprobs = logprobs or _list(_get(mo, "logprobs"))
        if version is None:
            version = _get(mo, "weight_version")
        finish = _get(mo, "finish_reason")
    if version is None:
        version = policy_version
    if version is None:
        raise InvalidEpisode("missing_field", "%s: no weight_version and no policy_version given" % where)
    if not prompt and not response:
        raise InvalidEpisode("missing_field", "%s: no token ids" % where)
    for i, lp in enumerate(logprobs):
        if lp is None:
            raise InvalidEpisode("wrong_type", "%s: logprobs[%d] is null (the sampler returned none for that token)" % (where, i))
    if len(logprobs) != len(response):
        raise InvalidEpisode("length_mismatch", "%s: %d logprobs for %d response tokens" % (where, len(logprobs), len(response)))
    rec = {
        "type": "step", "step_id": step_id, "task_id": task, "trajectory_id": traj_id, "step_index": index,
        "policy_version": int(version), "prompt_ids": [int(t) for t in prompt], "response_ids": [int(t) for t in response],
        "response_logprobs": [_finite("logprob", lp, where) for lp in logprobs],
    }
    if role:
        rec["role"] = role
    msgs = _messages(_get(step, "chat_completions"))
    if msgs:
        rec["messages"] = msgs
    reward = _finite("reward", _get(step, "reward"), where)
    if reward is not None:
        rec["reward"] = reward
    done = _get(step, "done")
    if done is not None:
        rec["done"] = bool(done)
    if finish:
        rec["finish_reason"] = finish
    return rec


def _as_delta(rec, prev):
    """Rewrite step record rec as a delta of the step before it, prev
    (step_id, whole prompt, response, messages), when its prompt begins
    with prev's prompt and response (and they are not empty)."""
    pid, pprompt, presp, pmsgs = prev
    prompt = rec["prompt_ids"]
    n = len(pprompt) + len(presp)
    if n == 0 or len(prompt) < n or prompt[:len(pprompt)] != pprompt or prompt[len(pprompt):n] != presp:
        return
    del rec["prompt_ids"]
    rec["parent_step_id"] = pid
    rec["prompt_delta_ids"] = prompt[n:]
    msgs = rec.get("messages")
    # Compared as sent (key order counts), so the messages stored are the
    # text the whole record would have carried.
    if msgs is not None and pmsgs and len(msgs) >= len(pmsgs) and _line(msgs[:len(pmsgs)]) == _line(pmsgs):
        del rec["messages"]
        rec["messages_added"] = msgs[len(pmsgs):]


def _line(rec):
    return json.dumps(rec, separators=(",", ":"), allow_nan=False, default=str)


def write_records(records: Iterable[Mapping[str, Any]], dest: Union[str, os.PathLike[str], TextIO]) -> int:
    """Write records as JSON lines to ``dest`` (a path, appended to, or a
    text file object); ``rllm-pipe ingest --from`` reads them. Returns the
    number written."""
    if isinstance(dest, (str, os.PathLike)):
        with open(dest, "a", encoding="utf-8") as f:
            return write_records(records, f)
    n = 0
    for rec in records:
        dest.write(_line(rec) + "\n")
        n += 1
    dest.flush()
    return n


class PostError(RuntimeError):
    """The gateway refused a batch (status and body) or stayed unreachable."""

    def __init__(self, message: str, status: Optional[int] = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


__all__.append("PostError")


def post_records(records: Iterable[Mapping[str, Any]], url: str, token: Optional[str] = None, batch_size: int = 500, retries: int = 5,
                 backoff: float = 0.5, timeout: float = 30.0) -> int:
    """POST records to the gateway's ``/records`` in batches of
    ``batch_size`` lines, each acknowledged only once durable. A batch that
    fails with a connection error or a 5xx/429 answer is sent again, the
    same lines with the same step ids, so a batch that was in fact stored
    is dropped downstream as a duplicate; after ``retries`` retries (with
    doubling ``backoff`` seconds) PostError is raised. A 4xx answer (a bad
    line, a bad token) is raised at once. ``token`` defaults to the first
    of TOKEN_ENV that is set; it is sent as a bearer token and never
    logged. Returns the number of records accepted."""
    if token is None:
        for name in TOKEN_ENV:
            if os.environ.get(name):
                token = os.environ[name]
                break
    endpoint = url.rstrip("/") + "/records"
    records = list(records)
    accepted = 0
    for start in range(0, len(records), max(1, int(batch_size))):
        body = "".join(_line(r) + "\n" for r in records[start : start + batch_size]).encode("utf-8")
        accepted += _post(endpoint, body, token, retries, backoff, timeout)
    return accepted


def _post(endpoint, body, token, retries, backoff, timeout):
    headers = {"Content-Type": "application/x-ndjson"}
    if token:
        headers["Authorization"] = "Bearer " + token
    delay = backoff
    for attempt in range(retries + 1):
        req = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                data = resp.read()
                try:
                    return int(json.loads(data or b"{}").get("accepted", body.count(b"\n")))
                except (ValueError, AttributeError):
                    return body.count(b"\n")
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            if e.code < 500 and e.code != 429:
                raise PostError("POST %s: %d %s" % (endpoint, e.code, text), e.code, text) from None
            last = PostError("POST %s: %d %s" % (endpoint, e.code, text), e.code, text)
        except (urllib.error.URLError, OSError) as e:
            last = PostError("POST %s: %s" % (endpoint, getattr(e, "reason", e)))
        if attempt < retries:
            time.sleep(delay)
            delay *= 2
    raise last
