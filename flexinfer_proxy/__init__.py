"""flexinfer_proxy: the OpenAI-compatible proxy — routes, queues, signals demand."""
