"""The run API the window and the command line drive: a run owned by this process (it spawns and
watches the workers) or attached to one that another process owns, behind one interface."""
