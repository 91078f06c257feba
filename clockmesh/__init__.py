"""clockmesh: one view of a GPU/RDMA back-end fabric, with the cause and the fix.

This package holds only the command-line entry point. The product lives in the
``collector`` (fleet hosts), ``analytics`` (ops box), ``tui`` and ``lab`` packages;
imports flow one way: tui -> analytics -> collector.
"""

__version__ = "0.1.0"
