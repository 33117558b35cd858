"""`python -m engine generate|serve|bench|bench-spec|bench-load` (see engine.cli)."""
import sys

from .cli import main

sys.exit(main())
