import sys

from dcsjax.cli import main

sys.exit(main())
