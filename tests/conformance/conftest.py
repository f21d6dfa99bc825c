"""A persona's class runs only the suite's tests that no other class runs (suite.py)."""


def pytest_collection_modifyitems(config, items):
    dropped = [item for item in items if item.name in getattr(item.cls, "dropped_tests", ())]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
