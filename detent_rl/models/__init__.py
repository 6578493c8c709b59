"""Model code of the Llama / Qwen2 / Qwen3 families, shared by the rollout engine and the trainer."""
from detent_rl.models.config import ModelConfig, ModelConfigError
from detent_rl.models.context import ForwardContext, get_context, set_context
from detent_rl.models.loader import WeightsError, load_model
from detent_rl.models.model import CausalLM, deployment_for

__all__ = ["CausalLM", "WeightsError", "ForwardContext", "ModelConfig", "ModelConfigError", "deployment_for",
           "get_context", "load_model", "set_context"]
