import sys

from rollstream.cli import main

sys.exit(main())
