"""The generator: job queue, scheduler and step loop, the job and its sequences, speculative decoding, result
streaming (text, stop strings, banned strings, filters), metrics and the asyncio front.

Imports: sampling, model, cache, contract. Inside, each module imports only the layers below its own
(pyproject.toml): async_api > generator > job > speculative | streaming | banned | filters | adapters |
mm_inputs | image_prompt > sequence | metrics | step_budget | ngram | loops | embeddings."""
