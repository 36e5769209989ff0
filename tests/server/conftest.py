import sys
from pathlib import Path

import pytest
from triton_harness import Server

# client.py and fill_template.py are scripts, not a package: make them importable by the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "triton_server"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the server log to the report of a failing test that uses the ``server`` fixture."""
    outcome = yield
    report = outcome.get_result()
    server = getattr(item, "funcargs", {}).get("server")
    if report.failed and isinstance(server, Server):
        report.sections.append(("tritonserver log (tail)", server.log_tail()))
