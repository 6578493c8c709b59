"""detent_rl: on-policy RL whose trainer reproduces the rollout engine's logprobs bit for bit."""
__version__ = "0.1.0"
