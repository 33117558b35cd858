"""Tests of kernels/: Triton kernels against the torch reference, the reference against transformers."""
