"""Execution environments (where commands run) and dataset environments
(how a task of one dataset type is set up and graded)."""
