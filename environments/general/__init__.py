"""General: MiMo opensource-code and general_agent tasks in per-episode Docker containers."""
