"""Turning our resources into the Kubernetes objects that run them. Pure: no client calls.

- `workload`: a Model or ModelDeployment read into one `Workload` value;
- `source`: the one parser of source URLs;
- `backend` + `mlc_llm`, `vllm`, `llama_cpp`, `ollama`: one small module per backend
  behind one interface (command line, env, served name, health path);
- `model_files`: where a pod finds its model (cache, source volume or the backend's own
  download), the `/models` layout, a plain ModelDeployment model's resolution and the
  ModelCache a Model's `spec.cache.strategy` implies;
- `backend_cache`: the claim a backend that downloads or compiles its model keeps its
  files in;
- `workloads`: the Deployment and Service around any backend, and its probes;
- `cache`: ModelCache storage, its download Job and the Memory flash loader;
- `finetune`: the training Job of a ModelCache's `spec.finetune`.

Everything here takes values and returns manifests (plain dicts); applying them is
the controller's (`flexinfer_k8s.reconcile_workload`, `reconcile_cache`).
"""
