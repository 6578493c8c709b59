"""Import stub of torchvision for SGLang's CPU tests (tests/sglang_env.py): SGLang's multimodal config
modules import torchvision at module level, which the attention backend, the sampler and the plugin
registry never use; PyPI's torchvision wheels are CUDA builds that do not load beside a CPU torch."""
__version__ = "0+detent.stub"
