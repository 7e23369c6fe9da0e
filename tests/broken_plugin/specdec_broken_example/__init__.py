"""A plugin whose import fails: it needs a module that is not installed."""

import specdec_missing_dependency_xyz  # noqa: F401  (does not exist: ModuleNotFoundError)

from specdec import hookimpl


@hookimpl
def specdec_register_methods(register):
    raise AssertionError("never reached: the import above fails")
