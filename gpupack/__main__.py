import sys

from gpupack.cli import main

sys.exit(main())
