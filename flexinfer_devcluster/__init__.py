"""The local control plane for tests, benchmarks and the demo; never in the image.

`assets` builds etcd, kube-* and kwok once into ~/.cache/flexinfer; `localpki` makes
throwaway certificates; `localcluster.LocalCluster` runs the control plane on
loopback; `devcluster` is `flexinfer dev cluster`. Imported only by tests,
benchmarks and the command's dev verbs (the `dev` extra brings `cryptography`).
"""
