"""Benchmark suite of deepgemm-jit: ``python -m bench --help``.

Importing this package (or any pure-Python module of it: suites, dtypes, metrics, report) touches no GPU.
"""
