"""The `pagedeck` subcommands and their one-line descriptions, in the order the help lists them."""
from __future__ import annotations

# command -> one line for --help
COMMANDS = {
    "serve": "Start the OpenAI-compatible server (python -m engine serve)",
    "run": "Chat with a model in the terminal",
    "ls": "List the models on this computer",
    "get": "Download a model from the Hugging Face Hub",
    "rm": "Delete a downloaded model",
    "ps": "Show what a running server holds",
    "bench": "Measure the engine's speed (python -m engine bench)",
    "batch": "Run a template over a file of inputs (python -m engine batch)",
    "completion": "Print a shell completion script",
}
FORWARDED = ("serve", "bench", "batch")  # the engine's own commands, every flag passed through


def commands_help() -> str:
    """The "Available Commands" block of the help."""
    width = max(map(len, COMMANDS)) + 2
    return "Available Commands:\n" + "\n".join(f"  {name:<{width}}{line}" for name, line in COMMANDS.items())
