"""Models on disk before any is loaded: what each is from its headers alone (info), whether it fits this
machine's memory (memory: the estimate the loader checks too) and where they are (discovery: the HF cache,
LM Studio, GPT4All, Ollama and the user's folders).

May import: config, ggml_blocks, gguf/, packing/, tokenizer/, weights and kernels: it reads headers and
estimates, never loads a model's weights.
"""
