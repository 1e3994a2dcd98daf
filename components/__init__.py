"""Swappable parts of an RL algorithm; a YAML config chooses one of each kind."""
