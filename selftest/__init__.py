"""The self-test (Quintain's provider and client driver) and the data-service roofline built on it.

Installed from the wheel, this package is ``svcframe_selftest`` (``svcframe.packages``); its modules import one
another relatively and launch themselves by ``__spec__.name``, so either name works.
"""

from importlib.resources import files
from pathlib import Path

#: The shipped server config (package data, ``selftest.json`` in this package): one server on loopback TCP
#: hosting the self-test provider as provider id 1. ``svcframe selftest config`` prints this path.
SELFTEST_CONFIG = Path(str(files(__name__).joinpath("selftest.json")))
