import sys

from cron.cli import main

sys.exit(main())
