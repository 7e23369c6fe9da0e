"""A plugin that calls ``sys.exit()`` while it is imported, as a script-style module might."""

import sys

sys.exit("specdec_exit_example needs a GPU")
