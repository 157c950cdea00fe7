"""Real, small, deterministic training workloads (DeepSpeed GPT, megatron-core TP=2) run on CPU with
gloo under torchrun. The integration tests, the demo, the sample traces and the benchmark train them."""
