import sys

from ups.cli import main

sys.exit(main())
