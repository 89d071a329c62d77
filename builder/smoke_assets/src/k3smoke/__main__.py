import sys

from k3smoke.cli import main

sys.exit(main())
