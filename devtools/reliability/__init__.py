"""The reliability suites: churn, escape, fuzz and load, one table.

    sudo .venv/bin/python -m devtools.reliability            # short (what CI runs)
    sudo .venv/bin/python -m devtools.reliability --full     # 1000-episode churn, 256-episode load

See devtools/reliability/__main__.py and packaging/README.md ("Reliability suites").
"""
