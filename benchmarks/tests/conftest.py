"""The lab's tests run under the suite's settings (tests/conftest.py): one thread, offline, seeded, the
lock for tests that must run alone, the rule that a fast test starts no interpreter importing torch, and a
session fixture per script (``finetune_glue``, ...). The fixtures are defined there and named here, so
pytest applies them below this folder too."""

from tests.conftest import (  # noqa: F401  (fixtures pytest finds by name in a conftest)
    _fast_tests_start_no_interpreter,
    _one_at_a_time,
    _seed,
    finetune_glue,
    pytest_collection_modifyitems,
)
