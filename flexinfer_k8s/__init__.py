"""flexinfer_k8s: the controller — cluster state to snapshots to the core to applied changes."""
