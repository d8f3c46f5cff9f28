import sys

from ups.train.main import main

sys.exit(main())
