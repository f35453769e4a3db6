"""A user's env module with a bug in it: importing it raises (not an ImportError)."""

raise RuntimeError("the rail's length is not set\nsecond line of the message")
