"""Reading and validating YAML inputs into frozen typed models (DESIGN §1: spec)."""

from planner.spec.cluster import Cluster, LinkSpec, Node, NodeGroupSpec, ZoneSpec
from planner.spec.gpu import GpuType
from planner.spec.load import cluster_from_dict, load_cluster, load_model, load_training
from planner.spec.model import ModelSpec
from planner.spec.training import Training

__all__ = [
    "Cluster", "GpuType", "LinkSpec", "ModelSpec", "Node", "NodeGroupSpec", "Training", "ZoneSpec",
    "cluster_from_dict", "load_cluster", "load_model", "load_training",
]
