"""The markers transformers' test mixins put on their tests (registered in transformers' own conftest.py,
which is not part of this suite): declared here, so that ``--strict-markers`` accepts them."""

UPSTREAM_MARKERS = (
    "accelerate_tests",
    "flash_attn_test",
    "flash_attn_3_test",
    "flash_attn_4_test",
    "torch_compile_test",
    "is_pipeline_test",
    "is_training_test",
    "order",
)


def pytest_configure(config):
    for name in UPSTREAM_MARKERS:
        config.addinivalue_line("markers", f"{name}: set by transformers' test mixins (tests/upstream)")
