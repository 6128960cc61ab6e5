"""The docs tests' preloaded ``python`` (tests/preloaded_python.py) runs a command as a fresh interpreter
does: the same ``sys.argv``, ``sys.path[0]``, ``__name__``, environment (with what torch's import sets),
output and exit status for a script, a module and ``-c`` code; a traceback that starts at the program; death
by a signal passed on; a killed shim takes its child with it; an environment the server was not started with
runs the real interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import preloaded_python
from .docs_blocks import docs_env

pytestmark = pytest.mark.slow  # the server imports torch and transformers once

PROBE = """\
import json, os, sys
import torch  # as every documented command does (its import sets TORCHINDUCTOR_CACHE_DIR)
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(),
                  "probe": os.environ.get("PROBE"), "inductor": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}))
print("to stderr", file=sys.stderr)
if sys.argv[-1] == "raise":
    raise ValueError("raised by the program")
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, str]:
    """The docs tests' environment, once the server is up (it imports torch and transformers first)."""
    env = docs_env(tmp_path_factory.mktemp("scratch"))
    socket_path = Path(env[preloaded_python.SOCKET_VARIABLE])
    deadline = time.monotonic() + 300
    while not socket_path.exists():
        assert time.monotonic() < deadline, (socket_path.parent / "server.log").read_text()
        time.sleep(0.2)
    return env


def run(python: str, args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "args",
    [["probe.py", "3", "x"], ["-m", "probe", "0"], ["-c", PROBE, "4"], ["probe.py", "0", "raise"]],
    ids=["script", "module", "code", "traceback"],
)
def test_a_served_command_runs_as_a_fresh_interpreter(served, tmp_path, args):
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**served, "PROBE": "set"}  # a variable the server did not start with: the real interpreter
    fresh = run(sys.executable, args, env=env, cwd=tmp_path)
    forked = run(preloaded_python.python(), args, env=served, cwd=tmp_path)
    assert forked.returncode == fresh.returncode, forked.stderr
    assert forked.stdout.replace('"probe": null', '"probe": "set"') == fresh.stdout
    assert forked.stderr == fresh.stderr
    refused = run(preloaded_python.python(), args, env=env, cwd=tmp_path)
    as_python = (fresh.returncode, fresh.stdout, fresh.stderr)
    assert (refused.returncode, refused.stdout, refused.stderr) == as_python
    log = (Path(served[preloaded_python.SOCKET_VARIABLE]).parent / "server.log").read_text()
    assert "the environment differs in ['PROBE']" in log  # the refusal, so the first run was served


def test_signals_reach_the_child_and_a_killed_shim_takes_it_along(served, tmp_path):
    sleeper = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
    pid_file = tmp_path / "pid"
    for how, returncode in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        pid_file.unlink(missing_ok=True)
        shim = subprocess.Popen([preloaded_python.python(), "-c", sleeper, str(pid_file)], env=served)
        while not pid_file.exists() or not pid_file.read_text():
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert child != shim.pid  # forked by the server
        shim.send_signal(how)  # SIGTERM is passed on; SIGKILL cannot be, the server sees the shim gone
        assert shim.wait(timeout=30) == returncode
        deadline = time.monotonic() + 30
        while _alive(child):
            assert time.monotonic() < deadline, f"the child of a shim killed by {how!r} still runs"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
