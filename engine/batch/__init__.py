"""Batch runs: one prompt template with `{column}` fields and a system prompt, run over every row of a CSV
or JSONL file as jobs of the one generator (which batches them and shares the system prompt's pages).

inputs (rows and the template), loop (the asyncio scheduler: rows in flight, pause, results as they
finish) and export are torch-free: the app's batch view runs them over its Backend. cli_run is
`python -m engine batch`, over a DynamicGeneratorAsync of its own, resumable through its output file.
"""
