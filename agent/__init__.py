"""TD-MPC2 in pure PyTorch: config, networks, planner, buffer, update and environments.

Imports nothing from workers/ or viewer/.
"""
