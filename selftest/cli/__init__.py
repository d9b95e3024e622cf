"""The self-test's commands, a plugin of the ``svcframe`` command line: the framework never imports them;
pyproject.toml registers each in the ``svcframe.cli`` entry-point group (see ``svcframe.cli``)::

    svcframe selftest run | bursts | nic-dispersion      workloads.py
    svcframe roofline collect | plot                     roofline.py
    svcframe roofline place | io | workflow              models.py
    svcframe history [show RUN] | report RUN             history.py
    svcframe bench                                       bench.py
"""
