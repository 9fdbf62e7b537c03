"""Start `python -m cron ...` with the app root importable (the harness only puts this folder on the path)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from cron.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
