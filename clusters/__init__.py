"""The reviewed truth: one YAML file per GPU training cluster, its schema and its loader.

Pure configuration: nothing in this package imports cdktf.
"""

from clusters.loader import CLUSTERS_DIR, cluster_files, load, load_all
from clusters.schema import ClusterConfig

__all__ = ["CLUSTERS_DIR", "ClusterConfig", "cluster_files", "load", "load_all"]
