"""A user's env module that ends the program at import, as a script's guard might."""

import sys

sys.exit("set RAIL_LENGTH first\nsecond line of the message")
