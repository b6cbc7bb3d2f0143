"""The trainer-facing HTTP surfaces of a service: the falcon app and the plain
step route, the bearer-token gate and its principals, the wire models, MCP,
OpenEnv's forms and the task listing (docs/architecture.md §2)."""
