import sys

from kernel_lab.cli import main

sys.exit(main())
