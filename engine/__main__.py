"""`python -m engine generate|bench|bench-spec` (see engine.cli)."""
import sys

from .cli import main

sys.exit(main())
