"""The model: its config, weights and tokenizer, the Llama-family decoder over the paged cache, 4-bit linears,
LoRA adapters, and `Batch`, the one-step input the generator builds for it."""
