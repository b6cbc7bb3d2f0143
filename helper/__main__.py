import sys

from helper.main import main

sys.exit(main())
