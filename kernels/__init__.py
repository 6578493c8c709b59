"""Batch-invariant kernels, each with the SelIR program that selects its parameters."""
