"""Cluster I/O shared by the controller, the proxy and the command.

`kubeapi` (one request per call, a small error taxonomy), `resources` (where each kind
lives), `informers` (list + watch into a `Store`), `clock` (the one source of time),
`objects` (small readers of Kubernetes JSON) and `logs` (JSON lines). It decides
nothing: policy is the core's, writes of decisions are the controller's.
"""
