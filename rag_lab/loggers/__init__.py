"""Loggers (``conf/logger/``): where metrics, tables and trajectories go besides the run dir."""
