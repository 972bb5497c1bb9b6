"""The administrator's policy of the local cluster: what its tests and the demo run under.

The built-in policy (`flexinfer_k8s.render.policy`) refuses what only a test cluster
needs. A controller on the local cluster runs with this one (`dev_policy()` in
process, `dev_policy_yaml()` as a `--policy` file), which is the built-in policy plus:

- `podAnnotationKeys: [flexinfer.test/*]`: kwok's simulated load, termination and Job
  timings (`flexinfer_devcluster.localcluster`);
- `nodeSelectorKeys`: `type` (the kwok nodes' `type: kwok`) and
  `flexinfer.dev/process-node`;
- `gpuNodeTaints`: the process node's `flexinfer.dev/process-node=true:NoSchedule`;
- `hostPathPrefixes`: the temporary directory, where tests and the demo write the tiny
  model that the process node serves through a `file://` source, and `/srv/datasets`,
  where `examples/finetune-modelcache.yaml` finds its dataset;
- `imagePrefixes`: `registry.local/` and `registry.example/`, the images the examples
  name for servers and trainers you build yourself (docs/backends/mlc-llm.md), and
  `trainer.local/`, the trainer the finetune tests name (kwok runs no image).

Everything else (tolerations of other taints, other keys, host paths, images) is
refused as on a real cluster. Data only.
"""

from __future__ import annotations

import tempfile

import yaml

from flexinfer_devcluster.localcluster import KWOK_NODE_LABEL
from flexinfer_devcluster.processnode import PROCESS_NODE_LABEL, PROCESS_NODE_TAINT
from flexinfer_k8s.render.policy import AdminPolicy, admin_policy_from_yaml

EXAMPLE_IMAGE_PREFIXES = ("registry.local/", "registry.example/", "trainer.local/")
EXAMPLE_DATASETS = "/srv/datasets"


def dev_policy_yaml() -> str:
    defaults = AdminPolicy()
    document = {
        "gpuNodeTaints": [
            *(
                {"key": t.key, "value": t.value, "effect": t.effect}
                for t in defaults.gpu_node_taints
            ),
            dict(PROCESS_NODE_TAINT),
        ],
        "hostPathPrefixes": [
            *defaults.host_path_prefixes,
            tempfile.gettempdir(),
            EXAMPLE_DATASETS,
        ],
        "imagePrefixes": list(EXAMPLE_IMAGE_PREFIXES),
        "nodeSelectorKeys": [*defaults.node_selector_keys, KWOK_NODE_LABEL, PROCESS_NODE_LABEL],
        "podAnnotationKeys": ["flexinfer.test/*"],
    }
    return str(yaml.safe_dump(document, sort_keys=False))


def dev_policy() -> AdminPolicy:
    return admin_policy_from_yaml(dev_policy_yaml())
