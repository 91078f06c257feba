"""Simulators that produce exactly the records the collectors produce, plus ground truth."""

from analytics.sim.mesh_simulator import GroundTruth, MeshSimulator, SimConfig, SimResult

__all__ = ["GroundTruth", "MeshSimulator", "SimConfig", "SimResult"]
