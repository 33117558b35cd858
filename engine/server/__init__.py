"""pagedeck as an OpenAI-compatible server: `python -m engine serve`, or the app's Server panel.

Qt-free; the app hands it its own generator. See app.py for the routes and ARCHITECTURE.md for the design.
Imports: the generator and everything below it, through the async front (never the benchmarks or the CLI).
"""
from .app import OpenAIServer
from .errors import ApiError
from .served import ServedModel

__all__ = ["ApiError", "OpenAIServer", "ServedModel"]
