"""Selection programs for our kernel families, and transcriptions of SGLang's selection code.

A family's program is the function `<family>_program` (`rows.rmsnorm_program`, `matmul.matmul_program`,
`attention.attention_program`, ...), apart from the kernel launcher `<family>` and the trainer's
`<family>_autograd`; as a Program it is named `<family>` (`@selection(name=...)`), the name reports,
the registry and `kernels/selections.py`'s FAMILIES use. Helper programs keep their own names, and
the SGLang transcriptions keep upstream's function names.
"""
