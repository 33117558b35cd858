"""Load-time packing: stored matrices into the CPU kernels' formats (repack: which tensors are packed, in which
format, what each costs), the C++ repackers' route for K-quants (repack_fast) and all-Q4_K fused groups copied
straight into their fused matrix (fused_q4). The formats' nn-level classes are engine.model.qlinear's.

May import: ggml_blocks, qlinear/ and kernels; nothing that reads files (gguf/ hands it the blocks).
"""
