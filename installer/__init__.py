"""The installer: environment doctor, cross-compile check, self-test, report, first start.

A second program beside the kernel library: it builds, checks and measures ``kernels/`` on this
machine and writes the report the nodes read. It may start processes (``childproc``, the self-test
worker); ``kernels/`` never does. Nothing is imported here eagerly: node import stays cheap.
"""
