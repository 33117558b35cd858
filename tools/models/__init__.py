"""Model files for tests, benchmarks and demos: `python -m tools.models.NAME --help`. synthetic_gguf (random-weight
GGUFs of real shapes and llama.cpp's quantization recipes), vlm_gguf and mmproj_gguf (a vision-language model's
text and vision GGUFs, as llama.cpp's converter writes them), llamacpp_check (a GGUF's per-layer types, and
llama.cpp's and pagedeck's logits on it) and train_lora (the demo LoRA adapters in resources/loras/) are
commands; _synthetic_vocab (real-size BPE and SentencePiece vocabularies for synthetic_gguf) and
_llamacpp_quantized (real models' presets quantized by llama.cpp's own quantizer) are helpers.
"""
