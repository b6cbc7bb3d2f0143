"""One service process around its episode manager: the ``Service`` object
and its background duties, readiness (sd_notify), the gunicorn worker class
``camg.serve`` runs, and what its ``/metrics`` tell ``camg status``."""
