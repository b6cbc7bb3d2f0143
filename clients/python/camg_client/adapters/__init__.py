"""camg environments as the environments of RL frameworks, one module each,
every one importing its framework only when its classes are first used (the
client core, and the services' venv that maps this package in, carry none):

* ``camg_client.adapters.verifiers``: verifiers 0.4 (``vf.Env`` + ``vf.Taskset``;
  taskset id ``camg_verifiers``), extra ``verifiers``;
* ``camg_client.adapters.skyrl_gym``: SkyRL-Gym 0.4 (a ``BaseTextEnv`` registered
  as ``camg``), extra ``skyrl``.

NeMo-Gym 0.7 is not adapted: it requires Python >= 3.13.14 and camg's
interpreters are 3.11 and 3.12. In each, one framework episode is one camg
episode, its reward camg's terminal reward, and ``reward: null`` (an
infrastructure failure, with its ``failure_class``) the framework's failed or
masked outcome, never 0.
"""
