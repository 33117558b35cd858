"""GGUF files: the header parsed once per file (header, its string arrays decoded in bulk by strings), split
sets read as one model (split), the file memory-mapped with its tensors as views (file), and its tensors into
an HF-named state dict (weights). The block formats themselves are engine.model.ggml_blocks (the packed
linears and the loader's packing decode them too).

May import: engine.model's shared modules (config, tensor_names, ggml_blocks, embedding, heap, moe) and packing/; never
tokenizer/, lora/ or catalog/ (they read GGUFs through this package).
"""
