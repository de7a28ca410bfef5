"""patchgym: train and evaluate multi-turn software-engineering agents with RL in real sandboxes."""

__version__ = "0.1.0"
