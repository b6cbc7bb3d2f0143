"""camg: task-environment services for reinforcement-learning trainers."""

__version__ = "0.1.0"
