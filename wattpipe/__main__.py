import sys

from wattpipe.cli import main

sys.exit(main())
