"""The OpenEnv transport that runs inside a MiMo task container (seed 001).

``python -m mimoagent.transport --root /opt/mimo-task`` serves the task in
``<root>/instance.json`` over openenv's WebSocket protocol (``/ws``; one
session at a time; state lives in the session) on a Unix socket only root
can reach (listener.py: no TCP listener), with a server of the stdlib alone
(wsserver.py, protocol.py: the container's memory is mostly this
process's). The software kind (``opensource-code``) speaks
shell/finish; ``general_agent`` adds ``tool`` and an answer-carrying
``finish`` (see software.py, general.py).
"""
