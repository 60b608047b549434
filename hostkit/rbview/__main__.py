import sys

from .draw import main

sys.exit(main())
