"""The chaos suite's routers follow ``--store`` as the e2e suite's do (tests/e2e/conftest.py)."""

from tests.e2e.conftest import store_backend  # noqa: F401  (autouse: --store postgresql)
