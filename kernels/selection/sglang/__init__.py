"""SelIR transcriptions of SGLang 0.5.23's own kernel-selection code (for the SGLang patch)."""
SGLANG_VERSION = "0.5.23"
