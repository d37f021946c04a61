"""Every docstring example of rllm_pipe runs as printed (doctest), with the
names the examples use provided for real: ``location``, an ``rllm-pipe
serve`` over a small generated run; ``gateway``, an ``rllm-pipe gateway``;
and a working folder holding that run (``data``) and its Iceberg catalog
(``lake/catalog.db``, made by ``rllm-pipe iceberg sync``). Modules whose
examples need torch or verl run only where those import (test_verl.py runs
them in the verl environment). And train/python/README.md's trainer loop
prints what the README says it prints."""

import contextlib
import doctest
import importlib
import importlib.util
import io
import pathlib
import pkgutil
import re
import shlex
import subprocess
import sys

import pytest

import rllm_pipe
from conftest import BIN, Gateway, Server, example_env, has_gateway_command, run

# Every module of the package, with the number of its docstrings that must
# hold examples (so an example turned back into prose fails here).
MODULES = {
    "rllm_pipe": 1,
    "rllm_pipe.client": 0,
    "rllm_pipe.dataset": 1,
    "rllm_pipe.emit": 1,
    "rllm_pipe.iceberg": 1,
    "rllm_pipe.padded": 0,
    "rllm_pipe.shards": 0,
    "rllm_pipe.verl": 1,
}
# What a module's examples import beyond pyarrow and numpy.
NEEDS = {"rllm_pipe.iceberg": ("pyiceberg",), "rllm_pipe.verl": ("torch", "verl")}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A run of 8 groups of 4 multi-turn trajectories over three policy
    versions, ingested into ./data."""
    d = tmp_path_factory.mktemp("doctest")
    run("gen", "--groups", "8", "--group-size", "4", "--turns", "1..4", "--policy-versions", "3", "--seed", "1", "--to", str(d / "t.jsonl"))
    run("ingest", "--from", str(d / "t.jsonl"), "--to", str(d / "data"), "--group-size", "4", "--quiet")
    return d


def provide(name, work, stack):
    """The globals module name's examples use, backed by real processes
    (stopped when stack closes)."""
    if name in ("rllm_pipe", "rllm_pipe.dataset", "rllm_pipe.verl"):
        layout = ["--layout", "trajectories"] if name != "rllm_pipe" else []
        srv = Server(work / "data", "--follow=false", "--poll", "50ms", "--consumer-group", "doctest-" + name, *layout)
        stack.callback(srv.stop)
        return {"location": srv.location}
    if name == "rllm_pipe.emit":
        if not has_gateway_command():
            pytest.skip("this rllm-pipe has no `gateway` command")
        gw = Gateway(work, "http://127.0.0.1:9")  # POST /records never calls the upstream
        stack.callback(gw.stop)
        return {"gateway": gw.url}
    if name == "rllm_pipe.iceberg" and not (work / "lake" / "catalog.db").exists():
        run("iceberg", "sync", "--from", str(work / "data"), "--catalog", str(work / "lake" / "catalog.db"))
    return {}


def run_doctests(name, globs):
    """Runs the examples of module name with globs; returns (docstrings with
    examples, examples run, doctest's report of the failures)."""
    mod = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(mod, name, extraglobs=globs) if t.examples]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    out = io.StringIO()
    for t in sorted(tests, key=lambda t: t.name):
        runner.run(t, out=out.write)
    assert runner.tries == sum(len(t.examples) for t in tests)
    return len(tests), runner.tries, out.getvalue() if runner.failures else ""


def test_every_module_is_listed():
    names = {"rllm_pipe"} | {"rllm_pipe." + m.name for m in pkgutil.iter_modules(rllm_pipe.__path__)}
    assert names == set(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_docstring_examples(name, work, monkeypatch):
    missing = [m for m in NEEDS.get(name, ()) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{name}'s examples need {', '.join(missing)} (scripts/verl-test.sh runs them)")
    monkeypatch.chdir(work)
    with contextlib.ExitStack() as stack:
        docstrings, examples, failures = run_doctests(name, provide(name, work, stack))
    assert not failures, failures
    assert docstrings >= MODULES[name], f"{name}: {docstrings} docstrings with examples, want {MODULES[name]}"


README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_loop_runs_as_printed(tmp_path):
    """The README's commands (gen and ingest as printed; serve with its
    flags on a free port) and its loop.py print the output it shows."""
    text = README.read_text()
    sh = next(b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "rllm-pipe serve" in b)
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "Client(" in b)
    want = re.search(r"```python\n" + re.escape(code) + r"```\s+prints\s+```text\n(.*?)```", text, re.S).group(1)
    serve = None
    for line in sh.splitlines():
        args = shlex.split(line.split("#")[0])
        if args[:2] == ["bin/rllm-pipe", "serve"]:
            serve = args
        elif args:
            assert args[0] == "bin/rllm-pipe", line
            subprocess.run(line.replace("bin/rllm-pipe", shlex.quote(BIN), 1), shell=True, cwd=tmp_path, check=True, timeout=60)
    assert serve[-1] == "&" and serve[2:4] == ["--from", "data"] and serve[4] == "--listen", serve
    srv = Server(tmp_path / "data", *serve[6:-1])
    try:
        assert '"grpc://127.0.0.1:8815"' in code
        out = subprocess.run([sys.executable, "-c", code.replace("grpc://127.0.0.1:8815", srv.location)], cwd=tmp_path, env=example_env(),
                             capture_output=True, text=True, timeout=60)
    finally:
        srv.stop()
    assert out.returncode == 0, out.stderr
    assert out.stdout == want
