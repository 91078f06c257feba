"""A leaf-spine fabric of network namespaces for running clockmesh for real on one machine."""
