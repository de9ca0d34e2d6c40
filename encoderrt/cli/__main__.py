import sys

from encoderrt.cli import main

sys.exit(main())
