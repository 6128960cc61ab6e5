"""A preloaded interpreter for the documented commands the docs tests run: ``python`` forked, not started.

Each documented command runs in a fresh interpreter (the point of the docs tests), and on the 2-core CI
machine a fresh interpreter spends 5-8 s importing torch and transformers before the command's own work,
often more than the work itself at the tests' budgets. So each test worker keeps one server process that has
imported torch, transformers, datasets, accelerate and hf_efficient once; the docs tests put a ``python``
shim first on ``PATH`` that hands its command line, environment, working folder and standard streams to the
server, which forks a child that runs the command as ``python`` would (``-m module``, ``-c code`` or a
script, ``sys.argv`` and ``sys.path[0]`` as Python sets them, atexit handlers, exit status) and reports the
child's exit status back. The shim forwards signals to the child; a shim that dies takes its child with it.

A fork is a fresh interpreter only where nothing read at import time differs, so the server serves a command
only when its environment equals the server's (apart from variables no module reads at import: the shell's
PWD / SHLVL / ``_`` and pytest's PYTEST_CURRENT_TEST), and only for the command lines it understands;
anything else (other options, ``accelerate launch`` and ``torchrun``, which start their own interpreters,
another ``HF_HOME``) runs the real interpreter, as does everything when the server is not up. The preload must
be silent and start no thread (a warning printed once at import would otherwise be hidden from every
command; a fork copies only the forking thread), or the server does not serve at all.

Used by tests/docs_blocks.py (``docs_env``); ``HF_PRELOADED_PYTHON=0`` turns it off for a run.
"""

from __future__ import annotations

import atexit
import builtins
import io
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

PRELOAD = ("torch", "transformers", "transformers.modeling_utils", "datasets", "accelerate", "hf_efficient")
# Read by no module at import, and different for every command of a shell or test.
RUNTIME_ONLY = {"PWD", "OLDPWD", "SHLVL", "_", "PYTEST_CURRENT_TEST"}
SOCKET_VARIABLE = "HF_EFFICIENT_PRELOADED_PYTHON"  # the server's socket, in the environment it serves

HEADER = struct.Struct("!I")  # the length of a JSON message that follows


def _send(conn: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    conn.sendall(HEADER.pack(len(data)) + data)


def _receive_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _receive(conn: socket.socket) -> dict:
    (size,) = HEADER.unpack(_receive_exactly(conn, HEADER.size))
    return json.loads(_receive_exactly(conn, size))


# --- the shim: a `python` on PATH, run by the real interpreter with -I -S (no site: milliseconds) ---------

SHIM = """#!{python} -IS
# hf_efficient's docs tests: hands this command to the preloaded interpreter (tests/preloaded_python.py).
import sys
sys.path.insert(0, {tests!r})
import preloaded_python
preloaded_python.shim_main({python!r})
"""


def _program(argv: list[str]) -> dict | None:
    """What ``python argv`` runs, when the server can run it: {"kind": "module"|"code"|"script", ...}."""
    if not argv or argv[0] == "-":
        return None  # an interactive interpreter or a program on stdin
    first, rest = argv[0], argv[1:]
    if first in ("-m", "-c") and rest:
        return {"kind": "module" if first == "-m" else "code", "target": rest[0], "args": rest[1:]}
    if first.startswith("-"):
        return None  # options change the interpreter itself (-u, -O, -X, -W, -E, -I ...)
    return {"kind": "script", "target": first, "args": rest}


def shim_main(python: str) -> None:
    program = _program(sys.argv[1:])
    address = os.environ.get(SOCKET_VARIABLE)
    if program is None or not address:
        os.execv(python, [python, *sys.argv[1:]])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(address)
        request = {"program": program, "env": dict(os.environ), "cwd": os.getcwd()}
        data = json.dumps(request).encode()
        socket.send_fds(conn, [HEADER.pack(len(data))], [0, 1, 2])
        conn.sendall(data)
        reply = _receive(conn)
    except (OSError, EOFError):
        reply = {"refused": "the server is not up"}
    if "refused" in reply:
        conn.close()
        os.execv(python, [python, *sys.argv[1:]])
    pid = reply["pid"]
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, lambda number, _frame: os.kill(pid, number))
    try:
        status = _receive(conn)["status"]
    except EOFError:
        status = 1
    if status < 0:  # the child died of a signal: so does the shim, as the shell expects
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


# --- the server ------------------------------------------------------------------------------------------


def _comparable(env: dict) -> dict:
    return {key: value for key, value in env.items() if key not in RUNTIME_ONLY}


def _run_child(request: dict, fds: list[int]) -> None:
    """In the forked child: become ``python <program>`` with the request's streams, folder and environment,
    run it, and exit as the interpreter would."""
    import threading

    signal.set_wakeup_fd(-1)  # the server's, below
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd, target in zip(fds, (0, 1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    program = request["program"]
    # a fresh interpreter seeds numpy's global generator from the OS; a fork would share the server's
    import numpy

    numpy.random.seed()
    import runpy

    code = 0
    try:
        if program["kind"] == "module":
            sys.argv = [program["target"], *program["args"]]  # runpy puts the module's path in argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(program["target"], run_name="__main__", alter_sys=True)
        else:  # Python runs code and scripts in a new __main__ (a script's compiled under its absolute path)
            main = type(sys)("__main__")
            main.__builtins__ = builtins
            sys.modules["__main__"] = main
            if program["kind"] == "code":
                sys.argv, sys.path[0] = ["-c", *program["args"]], ""
                source, filename = program["target"], "<string>"
            else:
                sys.argv = [program["target"], *program["args"]]
                filename = main.__file__ = os.path.abspath(program["target"])
                sys.path[0] = os.path.dirname(os.path.realpath(filename))
                with io.open_code(filename) as file:
                    source = file.read()
            exec(compile(source, filename, "exec"), main.__dict__)
    except SystemExit as exit_:
        if exit_.code is None:
            code = 0
        elif isinstance(exit_.code, int):
            code = exit_.code
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException as error:  # the traceback from the program's frames on, as Python prints it
        frames = error.__traceback__
        ours = (_run_child.__code__.co_filename, runpy.run_module.__code__.co_filename)  # and runpy's
        while frames.tb_next and frames.tb_frame.f_code.co_filename in ours:
            frames = frames.tb_next
        sys.excepthook(type(error), error.with_traceback(frames), frames)
        code = 1
    try:
        threading._shutdown()  # the interpreter waits for its non-daemon threads before exiting
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
    os._exit(code)


def serve(address: str, parent: int) -> None:
    """Preload, then fork a child per request until the parent (a test worker) is gone."""
    environment = _comparable(dict(os.environ))  # what a served command's environment must equal
    for name in PRELOAD:
        __import__(name)
    # what the imports set (torch sets TORCHINDUCTOR_CACHE_DIR): a fresh interpreter's imports set it too
    set_by_imports = {key: value for key, value in os.environ.items() if environment.get(key) != value}
    import threading

    sys.stdout.flush()
    sys.stderr.flush()
    printed = os.lseek(2, 0, os.SEEK_CUR)  # stderr is the server's log file, empty before the preload
    if threading.active_count() > 1 or printed:  # a fork would lose threads, or hide what import printed
        threads = threading.active_count() - 1
        print(f"not serving: {threads} threads started, {printed} bytes printed", file=sys.stderr)
        return
    # a child's exit wakes the loop below at once (SIGCHLD writes to this pipe), so its status is not late
    wakeup, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda number, frame: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".tmp")
    os.rename(address + ".tmp", address)  # shims connect only once the preload is done
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        readable, _, _ = select.select([listener, wakeup, *children.values()], [], [], 0.5)
        for conn in readable:
            if conn is wakeup:
                os.read(wakeup, 4096)
            elif conn is listener:
                _accept(listener, environment, set_by_imports, children, (wakeup, wakeup_write))
            else:  # the shim is gone (killed): its child goes too; its status is reaped below
                pid = next(pid for pid, c in children.items() if c is conn)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            try:
                _send(conn, {"status": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass
            conn.close()
    for pid in children:
        os.kill(pid, signal.SIGKILL)


def _accept(
    listener: socket.socket,
    environment: dict,
    set_by_imports: dict,
    children: dict,
    server_fds: tuple[int, ...],
) -> None:
    conn, _ = listener.accept()
    try:
        header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
        (size,) = HEADER.unpack(header + _receive_exactly(conn, HEADER.size - len(header)))
        request = json.loads(_receive_exactly(conn, size))
    except (OSError, EOFError, ValueError):
        conn.close()
        return
    asked = _comparable(request["env"])
    differs = sorted(k for k in environment.keys() | asked.keys() if environment.get(k) != asked.get(k))
    if differs:
        for fd in fds:
            os.close(fd)
        _send(conn, {"refused": f"the environment differs in {differs[:5]}"})
        print(f"refused {request['program']}: the environment differs in {differs[:5]}", file=sys.stderr)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        for fd in server_fds:
            os.close(fd)
        listener.close()
        for other in children.values():
            other.close()
        conn.close()
        _run_child({**request, "env": {**request["env"], **set_by_imports}}, fds)
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    children[pid] = conn


# --- in the test worker ----------------------------------------------------------------------------------

_started: dict[str, object] = {}


def enabled() -> bool:
    return os.environ.get("HF_PRELOADED_PYTHON") != "0"


def _folder() -> Path:
    """This worker's folder: the shim (bin/python), the server's socket and log, the shared HF_HOME."""
    if "folder" not in _started:
        folder = Path(tempfile.mkdtemp(prefix="preloaded-python-"))
        (folder / "bin").mkdir()
        shim = folder / "bin" / "python"
        shim.write_text(SHIM.format(python=sys.executable, tests=str(Path(__file__).parent)))
        shim.chmod(0o755)
        _started["folder"] = folder
        atexit.register(_stop)
    return _started["folder"]


def python() -> str:
    """The ``python`` the docs commands run: the shim, or this interpreter when turned off."""
    return str(_folder() / "bin" / "python") if enabled() else sys.executable


def environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a served command: the shim first on ``PATH``, the server's socket, and one ``HF_HOME`` for
    the worker (a module reads it at import, so it cannot differ between served commands). The first call
    starts the server with that environment; until its preload is done, commands run the real interpreter."""
    if not enabled():
        return env
    folder = _folder()
    served = {
        **env,
        "HF_HOME": str(folder / "hf_home"),
        "PATH": f"{folder / 'bin'}:{env.get('PATH', '')}",
        SOCKET_VARIABLE: str(folder / "server.sock"),
    }
    if "process" not in _started:
        _started["process"] = subprocess.Popen(
            [sys.executable, __file__, served[SOCKET_VARIABLE], str(os.getpid())],
            env=served,
            cwd=Path(__file__).parents[1],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(folder / "server.log", "w"),  # noqa: SIM115 - open for the server's lifetime
        )
    return served


def _stop() -> None:
    process = _started.get("process")
    if process is not None and process.poll() is None:
        process.terminate()
        process.wait(timeout=10)
    shutil.rmtree(_started["folder"], ignore_errors=True)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
