"""Suite-wide settings: one thread (many times faster on the 2-core CI machine), offline hub, deterministic
seeds, and the markers of pyproject.toml ([tool.pytest.ini_options]): ``slow`` and ``distributed`` tests run
in ``make test`` (CI) and are left out by ``make test-fast``; ``gpu`` tests are skipped where
``torch.cuda.is_available()`` is False.

The suite runs on every core (pytest-xdist, ``-n auto``: the Makefile), one torch thread per worker. Tests
that must not run side by side (multi-process launches, which each want every core and race for free ports;
mounts) run one at a time: every ``distributed`` test and every test marked ``one_at_a_time`` holds a lock
that the workers of one run share. A lock rather than xdist's ``--dist loadgroup``: with pytest 9.2,
xdist 3.8 no longer renames the grouped tests, so its groups silently split across workers. Every test writes
under its own ``tmp_path``; the data caches tests share (graph sets, Fashion-MNIST) build under locks of their
own.

Fixtures shared by one folder's tests live in that folder's conftest.py; plain helpers in modules named for
what they build (attention/helpers.py, models/<encoder>/helpers.py, ...), which register below for pytest's
assertion rewriting so their failures show the compared values.
"""

import os
import subprocess

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
from filelock import FileLock  # noqa: E402

pytest.register_assert_rewrite(
    "tests.attention.contract",
    "tests.attention.helpers",
    "tests.models.helpers",
    "tests.models.text.checks",
    "tests.models.vision.checks",
    "tests.models.graph.checks",
    "tests.processes",
)

import torch  # noqa: E402

from .processes import starts_our_stack  # noqa: E402
from .script_loader import SCRIPT_NAMES, load_script  # noqa: E402

torch.set_num_threads(1)
# The GPU tests compile FlexAttention for many (core, dtype, shape, mask) kinds in one process; past torch's
# default recompile limit (8) it would fall back to its unfused kernel and those tests would no longer check
# the compiled one (pyproject.toml turns that fallback's warning into an error).
torch._dynamo.config.recompile_limit = 256


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _auto_class_registrations_restored():
    """``register_for_auto_class`` sets a class attribute (transformers' ``_auto_class``): a test, or a
    documented command run in this process, that calls it must not make every later save of that class in
    the worker write remote code."""
    from hf_efficient.models.families import FAMILIES

    classes = {cls for family in FAMILIES.values() for cls in (family.config_class, *family.classes())}
    saved = {cls: cls.__dict__.get("_auto_class", _INHERITED) for cls in classes}
    yield
    for cls, value in saved.items():
        if value is _INHERITED:
            cls.__dict__.get("_auto_class", _INHERITED) is _INHERITED or delattr(cls, "_auto_class")
        else:
            cls._auto_class = value


_INHERITED = object()  # a class without an _auto_class of its own


@pytest.fixture(autouse=True)
def _one_at_a_time(request, tmp_path_factory):
    """Under xdist, a ``distributed`` or ``one_at_a_time`` test holds the run's machine lock while it runs
    (a worker that reaches another such test waits for it); autouse, so set up before the test's other
    function-scoped fixtures."""
    exclusive = any(request.node.get_closest_marker(name) for name in ("distributed", "one_at_a_time"))
    if not exclusive or "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    # the parent of a worker's basetemp is the run's own folder, which every worker of the run shares
    with FileLock(tmp_path_factory.getbasetemp().parent / "one_at_a_time.lock"):
        yield


_PROCESS_MARKERS = ("slow", "distributed")


@pytest.fixture(autouse=True)
def _fast_tests_start_no_interpreter(request, monkeypatch):
    """A test not marked ``slow`` or ``distributed`` may not start a Python interpreter that imports torch or
    this package (seconds of imports each on this machine): `make test-fast` stays fast only while its tests
    run in-process. Such a start fails the test with the fix."""
    if any(request.node.get_closest_marker(name) for name in _PROCESS_MARKERS):
        yield
        return
    original = subprocess.Popen.__init__

    def refuse_our_stack(self, args, *rest, **kwargs):
        if starts_our_stack(args):
            shown = args if isinstance(args, str) else " ".join(map(str, args))
            raise AssertionError(
                f"{request.node.nodeid} starts a Python interpreter ({shown[:120]}): mark it "
                "@pytest.mark.slow (pyproject.toml: fresh interpreters are slow), or run the code in-process"
            )
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_our_stack)
    yield


def _script_fixture(name: str):
    @pytest.fixture(scope="session", name=name)
    def script():
        return load_script(name)

    script.__doc__ = f"scripts/{name}.py as a module (its main(args) runs a job in-process)."
    return script


# One session fixture per script, named after it: tests in scripts/, training/ and data/ ask for them.
for _name in SCRIPT_NAMES:
    globals()[_name] = _script_fixture(_name)


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``gpu`` on a machine without CUDA (they still show, as skipped)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
