"""The Dear PyGui window (built in the viewer issue). Imports workers/ through the run API only."""
