"""Build-time tooling of the AutoResearch environment: the demo image and the demo task set."""
