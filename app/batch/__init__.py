"""The batch view: a file of inputs, a template and a system prompt run as jobs of the window's backend."""
