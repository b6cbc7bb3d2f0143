"""The reliability suites: churn, escape, fuzz and load, one table.

    sudo .venv/bin/python -m tools.reliability            # short (what CI runs)
    sudo .venv/bin/python -m tools.reliability --full     # 1000-episode churn, 256-episode load

See tools/reliability/__main__.py and packaging/README.md ("Reliability suites").
"""
