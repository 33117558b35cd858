"""The model: its config, weights and tokenizer, the Llama-family decoder over the paged cache, 4-bit linears,
LoRA adapters, and `Batch`, the one-step input the generator builds for it. The loader builds a Model
(fusion, packing, the output head); a Model is config + layers + forward, with no state changed after load.

Imports: engine.cache, engine.contract and kernels (never sampling, the generator or anything above)."""
