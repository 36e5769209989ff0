import pytest
from triton_harness import Server  # which also makes triton_server's scripts importable


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the server log to the report of a failing test that uses the ``server`` fixture."""
    outcome = yield
    report = outcome.get_result()
    server = getattr(item, "funcargs", {}).get("server")
    if report.failed and isinstance(server, Server):
        report.sections.append(("tritonserver log (tail)", server.log_tail()))
