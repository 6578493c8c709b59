"""The GRPO trainer on the same model code, kernels and commitment tuple as the rollout engine."""
