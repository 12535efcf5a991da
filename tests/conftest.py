"""Suite-wide set-up: headless backends and the learning stack before any render context.

Tests render (MuJoCo / robosuite / LIBERO over EGL) and run models in one pytest process; importing
triton after an EGL context exists segfaults (../shared/ENV.md), so the process is prepared first,
exactly as the CLI does.
"""

from core.bootstrap import prepare_process

prepare_process()


def pytest_addoption(parser):
    parser.addoption("--full-sweeps", action="store_true",
                     help="run every case of a @pytest.mark.sweep test (default: the fixed sample it names)")


def pytest_collection_modifyitems(config, items):
    """A ``@pytest.mark.sweep(sample=PRED)`` test (e.g. every LIBERO task) runs its fixed sample, the cases whose
    parameters satisfy ``PRED``, unless ``--full-sweeps`` (``make test-all``) asks for all of them; slow tests
    run first."""
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("sweep")
        sampled = marker is None or config.getoption("--full-sweeps") or marker.kwargs["sample"](item.callspec.params)
        (keep if sampled else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    # the slow tests first (stable: each file's order kept), so that on several workers (pytest-xdist) the long
    # runs start at once instead of forming the tail
    items[:] = sorted(keep, key=lambda item: item.get_closest_marker("slow") is None)
