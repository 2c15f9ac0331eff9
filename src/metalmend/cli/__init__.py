"""The ``metalmend`` command line (entry point ``metalmend.cli.main:main``).

- ``main``: the application, ``run``, ``serve``, ``credentials``, ``version``, and the
  verbs other distributions add (the lab's ``lab``, ``demo``, ``demo-site``: entry points
  of the group ``metalmend.cli``);
- ``client``: the one client of ``metalmend serve`` (which service, as whom, the HTTP
  client, Status bodies, exit codes), used by
- ``node`` (``node ...`` and ``etcd health``: Promenade's and Drydock's APIs), ``design``
  (Deckhand's) and ``site`` (Shipyard's).
"""
