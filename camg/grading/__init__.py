"""What the environments' graders share: the LLM-judge client, the screens of
what an agent wrote (tamper rules, code screen), and the pytest guard run in
the test process (guard/camg_guard.py, data loaded by path) with its verdict."""
