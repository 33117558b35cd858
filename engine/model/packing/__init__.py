"""Load-time packing: stored matrices into the CPU kernels' formats (repack: which tensors are packed, in which
format, what each costs), the C++ repackers' route for K-quants (repack_fast), fused groups of one type (Q4_K,
Q5_K, Q6_K, IQ4_XS and the other types kept as the file's blocks; Q5_0/Q5_1; Q8_0) written straight into their
fused matrix (fused_on_read), the read-ahead hint on the mapped blocks (readahead) and the queue that runs a
load's byte moves out of the mapped file in one C++ call (move_queue). The formats' nn-level
classes are engine.model.qlinear's.

May import: ggml_blocks, qlinear/ and kernels; nothing that reads files (gguf/ hands it the blocks).
"""
