"""`python -m engine generate|bench` (see engine.cli)."""
import sys

from .cli import main

sys.exit(main())
