"""Another machine: a run served over HTTP (server.py, the files it serves: served.py), a
window's mirror of it (mirror.py) and the connected window's run (connected.py); what travels
between them (wire.py)."""
